"""What each page and endpoint shows, assembled from etcd, Redis and the services' gRPC APIs.

Every function takes the ``Gateway`` (and the ``SeriesStore`` where it plots history) and returns
plain dicts; the FastAPI layer only validates input and maps errors. A system that is not in this
build or not running yields ``{"available": False, "reason": ...}`` rather than made-up data.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import logging
import math
import time
from collections.abc import Generator, Iterator
from typing import Any

from microco.common.errors import InvalidArgument, MicrocoError, NotFound

from . import _links as links
from ._gateway import SYSTEMS, Gateway
from ._limits import DEFAULT_PAGE, paginate
from ._proto import enum_number, to_dict
from ._series import SeriesStore
from ._timeline import TERMINAL, hit_rate_series, job_timeline, state_seconds
from ._wall import GAP_FACTOR, device_lanes, in_window, mark_gaps, utilisation

log = logging.getLogger(__name__)


def unavailable(reason: str, **empty: Any) -> dict[str, Any]:
    return {"available": False, "reason": reason, **empty}


# --------------------------------------------------------------------------- services


def services_view(
    gw: Gateway, limit: int = DEFAULT_PAGE, cursor: str = "", tracker: Any = None
) -> dict[str, Any]:
    """Every registered instance with its health (gRPC health protocol, or /healthz for HTTP),
    a page at a time by (name, instance); health is checked for the page only. ``gone``: the
    instances seen earlier that left the registry (``tracker``, a ``_wall.ServiceTracker``)."""
    registered = gw.services()
    gone = tracker.observe(registered) if tracker is not None else []
    records, next_cursor = paginate(registered, lambda r: (r.name, r.instance_id), limit, cursor)
    health = gw.health(records)
    now = time.time()
    items = [
        {
            "name": r.name,
            "instance_id": r.instance_id,
            "address": r.address,
            "version": r.version,
            "started_at": r.started_at,
            "uptime_s": max(0.0, now - r.started_at) if r.started_at else 0.0,
            "metrics_address": r.metrics_address,
            "labels": dict(r.labels),
            "health": h,
        }
        for r, h in zip(records, health, strict=True)
    ]
    return {"services": items, "at": now, "next_cursor": next_cursor, "gone": gone}


def systems_view(gw: Gateway) -> dict[str, Any]:
    out = []
    for name in SYSTEMS:
        ok, reason = gw.availability(name)
        out.append({"name": name, "in_build": SYSTEMS[name].in_build(), "running": ok, "reason": reason})
    return {"systems": out}


# --------------------------------------------------------------------------- nodes


def nodes_view(gw: Gateway, limit: int = DEFAULT_PAGE, cursor: str = "") -> dict[str, Any]:
    """Nodes as registered in etcd (``/microco/nodes/<node>``) and the devices the scheduler sees."""
    nodes: list[dict[str, Any]] = []
    for key, raw in gw.kv.get_prefix("/microco/nodes/"):
        name = key.removeprefix("/microco/nodes/")
        if "/" in name:  # sub-keys of a node (e.g. per-device entries) are folded into the node
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {"raw": raw.decode(errors="replace")}
        nodes.append({"name": name, "info": doc if isinstance(doc, dict) else {"value": doc}})
    nodes, next_cursor = paginate(nodes, lambda n: (n["name"],), limit, cursor)
    on_page = {n["name"] for n in nodes}
    devices: list[dict[str, Any]] = []
    scheduler_info: dict[str, Any] = {}
    ok, reason = gw.availability("scheduler")
    if ok:
        try:
            scheduler = gw.scheduler()
            resp = to_dict(scheduler.list_nodes())
            devices = resp.pop("devices", [])
            scheduler_info = resp  # leader, policy, ... as the scheduler reports them
            raw = scheduler_info.pop("policy_settings_json", "")
            scheduler_info["policy_settings"] = json.loads(raw) if raw else {}  # every setting in force
            # who holds each device now (several jobs when packed)
            holders: dict[str, list[dict[str, str]]] = {}
            for job in (to_dict(j) for j in scheduler.list()):
                if job.get("state") in TERMINAL:
                    continue
                for d in job.get("device_ids") or []:
                    holders.setdefault(d, []).append({"id": job["id"], "state": job.get("state", "")})
            # the devices of this page's nodes (all of them when the scheduler names no node)
            devices = [d for d in devices if not d.get("node") or d["node"] in on_page or not on_page]
            for d in devices:
                d["jobs"] = holders.get(d.get("id", ""), [])
        except MicrocoError as exc:
            reason = f"scheduler: {exc}"
    return {
        "nodes": nodes,
        "devices": devices,
        "devices_reason": reason,
        "scheduler": scheduler_info,
        "next_cursor": next_cursor,
    }


# --------------------------------------------------------------------------- jobs


def _job_events_name(job_id: str) -> str:
    return f"job:{job_id}:events"


def _job_progress_name(job_id: str) -> str:
    return f"job:{job_id}:progress"


def _placement(job: dict[str, Any]) -> tuple[str, str, list[str]]:
    return str(job.get("state", "")), str(job.get("node", "")), [str(d) for d in job.get("device_ids") or []]


def record_job(series: SeriesStore, job: dict[str, Any], at: float, last_seen: dict[str, Any]) -> bool:
    """Append a job's state to its event series when its state or placement changed since the last
    sample, and its progress every time. Returns True when a state change was recorded."""
    job_id = job.get("id")
    if not job_id:
        return False
    state, node, devices = _placement(job)
    signature = (state, node, tuple(devices))
    changed = False
    if last_seen.get(job_id) != signature:
        previous = series.last(_job_events_name(job_id))
        prev_sig = (
            (previous.get("state"), previous.get("node"), tuple(previous.get("devices") or ()))
            if previous
            else None
        )
        if prev_sig != signature:
            series.append(
                _job_events_name(job_id),
                {
                    "at": at,
                    "state": state,
                    "node": node,
                    "devices": devices,
                    "message": job.get("message", ""),
                },
            )
            changed = True
        last_seen[job_id] = signature
    # Progress while the job can make any; a finished job's last point was taken as it ended.
    active = state not in TERMINAL and state != "queued"
    if (active or changed) and (job.get("step") or job.get("minibatch_ms")):
        series.append(
            _job_progress_name(job_id),
            {"at": at, "step": job.get("step", 0), "minibatch_ms": job.get("minibatch_ms", 0.0)},
        )
    return changed


SCHEDULER_JOBS_PREFIX = "/microco/scheduler/jobs/"


def _scheduler_histories(gw: Gateway, job_id: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """The state history the scheduler keeps in each job's etcd record (``history``: a list of
    ``[at, state, message]``), by job id. Best effort: an unreadable record has no history."""
    out: dict[str, list[dict[str, Any]]] = {}
    items: list[tuple[str, Any]] = []
    for attempt in (1, 2):  # one retry: a loaded etcd can miss a read's deadline once
        try:
            if job_id is not None:
                raw = gw.kv.get(SCHEDULER_JOBS_PREFIX + job_id)
                items = [(SCHEDULER_JOBS_PREFIX + job_id, raw)] if raw is not None else []
            else:
                items = list(gw.kv.get_prefix(SCHEDULER_JOBS_PREFIX))
            break
        except MicrocoError as exc:
            if attempt == 2:
                log.warning("cannot read job records from etcd (tried twice): %s", exc)
                return out
    for key, raw in items:
        try:
            rec = json.loads(raw)
            history = [
                {
                    "at": float(h[0]),
                    "state": str(h[1]),
                    "message": str(h[2]) if len(h) > 2 else "",
                    "node": "",
                    "devices": [],
                }
                for h in rec.get("history") or []
                if isinstance(h, list | tuple) and len(h) >= 2
            ]
        except (ValueError, TypeError, AttributeError):
            continue
        out[key.removeprefix(SCHEDULER_JOBS_PREFIX)] = history
    return out


def _state_at(history: list[dict[str, Any]], at: float) -> str | None:
    state = None
    for h in history:  # sorted by time
        if float(h["at"]) > at:
            break
        state = h["state"]
    return state


def _with_timeline(
    series: SeriesStore, job: dict[str, Any], now: float, history: list[dict[str, Any]]
) -> dict[str, Any]:
    """The job with its device timeline: the scheduler's own state history (from etcd) merged with
    the placements this console observed (from Redis), ending with the job's current state.

    When the scheduler keeps a history it decides the states and their times; the console's
    samples only say on which devices a state ran (a sample whose state disagrees with the history
    at its time was taken across a transition and is dropped)."""
    recorded = series.read(_job_events_name(job["id"]))
    history = sorted(history, key=lambda h: float(h["at"]))
    if history:
        placements = [
            e for e in recorded if e.get("devices") and _state_at(history, float(e["at"])) == e.get("state")
        ]
        events = [*history, *placements]
    else:
        events = list(recorded)
    submitted = float(job.get("submitted_at") or 0.0)
    first = min(events, key=lambda e: float(e["at"]), default=None)
    if submitted and (first is None or (first.get("state") != "queued" and float(first["at"]) > submitted)):
        # Without the scheduler's history (its record unreadable just now) the console's own
        # samples may begin after the job left the queue; every job waited there from its
        # submission until the first state observed.
        events.append({"at": submitted, "state": "queued", "node": "", "devices": []})
    state, node, devices = _placement(job)
    latest = max((float(e["at"]) for e in events), default=now)
    finished_at = float(job.get("finished_at") or 0.0)
    at = finished_at if state in TERMINAL and finished_at else max(now, latest)
    events.append({"at": at, "state": state, "node": node, "devices": devices})
    periods = job_timeline(events, now=now, finished_at=float(job.get("finished_at") or 0.0))
    return {**job, "timeline": periods, "seconds_in_state": state_seconds(periods), "history": history}


def list_jobs(
    gw: Gateway,
    series: SeriesStore,
    states: list[str] | None = None,
    owner: str = "",
    *,
    limit: int = DEFAULT_PAGE,
    cursor: str = "",
) -> dict[str, Any]:
    """A page of jobs, newest first (by submission time, then id), each with its timeline; the
    timelines are computed for the page only."""
    ok, reason = gw.availability("scheduler")
    if not ok:
        return unavailable(reason, jobs=[])
    from microco.api.scheduler.v1 import scheduler_pb2
    from microco.clients.scheduler import state_name

    numbers = []
    for s in states or []:
        n = enum_number(scheduler_pb2.JobState.DESCRIPTOR, s)
        if n is None:
            names = ", ".join(
                v.name.removeprefix("JOB_STATE_").lower()
                for v in scheduler_pb2.JobState.DESCRIPTOR.values[1:]
            )
            raise InvalidArgument(f"unknown job state {s!r}; expected one of {names}")
        numbers.append(n)
    # The client filters by the scheduler's state names. ``unspecified`` names no state a job
    # can be in: it matches no job (and a filter of only that matches none, not all).
    named = [name for n in numbers if (name := state_name(n)) != "unknown"]
    found = gw.scheduler().list(named, owner) if named or not numbers else []
    page, next_cursor = paginate(found, lambda j: (-float(j.submitted_at or 0.0), str(j.id)), limit, cursor)
    now = time.time()
    if len(page) == 1:
        histories = _scheduler_histories(gw, page[0].id)
    else:
        histories = _scheduler_histories(gw) if page else {}
    jobs = [_with_timeline(series, d, now, histories.get(d["id"], [])) for d in map(to_dict, page)]
    return {"available": True, "reason": "", "jobs": jobs, "at": now, "next_cursor": next_cursor}


def _gap_s(gw: Gateway) -> float:
    """Longer than this without a sample is a gap in a plotted series."""
    return GAP_FACTOR * gw.config.sample_every_s


def get_job(gw: Gateway, series: SeriesStore, job_id: str, *, window_s: float = 3600.0) -> dict[str, Any]:
    job = to_dict(gw.scheduler().get(job_id))  # Unimplemented when not in this build
    now = time.time()
    out = _with_timeline(series, job, now, _scheduler_histories(gw, job["id"]).get(job["id"], []))
    progress = in_window(series.read(_job_progress_name(job_id), last=500), now - window_s)
    out["progress"] = mark_gaps(progress, _gap_s(gw))
    return out


def devices_view(
    gw: Gateway,
    series: SeriesStore,
    window_s: float,
    hide_finished_s: float,
    buckets: int,
    limit: int = DEFAULT_PAGE,
    cursor: str = "",
) -> dict[str, Any]:
    """For a wall screen: one timeline lane per device over the window (jobs that ended more than
    ``hide_finished_s`` ago left out) and each device's utilisation per slice of the window (every
    job counted, finished or not), a page of devices at a time by (node, device)."""
    ok, reason = gw.availability("scheduler")
    if not ok:
        return unavailable(reason, lanes=[], utilisation=[])
    scheduler = gw.scheduler()
    devices = to_dict(scheduler.list_nodes()).get("devices", [])
    now = time.time()
    histories = _scheduler_histories(gw)
    jobs = [
        _with_timeline(series, d, now, histories.get(d["id"], [])) for d in map(to_dict, scheduler.list())
    ]
    every = device_lanes(jobs, devices, now=now, window_s=window_s, hide_finished_s=None)
    page, next_cursor = paginate(every, lambda lane: (lane["node"], lane["device"]), limit, cursor)
    shown = {lane["device"] for lane in page}
    lanes = [
        lane
        for lane in device_lanes(jobs, devices, now=now, window_s=window_s, hide_finished_s=hide_finished_s)
        if lane["device"] in shown
    ]
    return {
        "available": True,
        "reason": "",
        "start": now - window_s,
        "end": now,
        "bucket_s": window_s / buckets,
        "lanes": lanes,
        "utilisation": utilisation(page, now=now, window_s=window_s, buckets=buckets),
        "next_cursor": next_cursor,
    }


def job_log(gw: Gateway, job_id: str, tail_lines: int) -> dict[str, Any]:
    """The last ``tail_lines`` lines of a job's output (its latest attempt), from the node agent
    that keeps it (as ``microco job logs``). An unknown job is NotFound; a known one without a
    log is ``available: False`` with the reason (the page asks again as the job runs)."""
    job = to_dict(gw.scheduler().get(job_id))  # NotFound
    try:
        node, first, rest = gw.agents().open_log(
            job["id"], first_node=job.get("node", ""), tail_lines=tail_lines
        )
    except NotFound as exc:
        return unavailable(f"{exc} (the job is {job.get('state', '')})", job_id=job["id"])
    return {
        "available": True,
        "job_id": job["id"],
        "node": node,
        "attempt": first.attempt,
        "attempts": list(first.attempts),
        "text": b"".join([first.data, *(c.data for c in rest)]).decode(errors="replace"),
    }


def submit_job(gw: Gateway, spec: dict[str, Any]) -> dict[str, Any]:
    """Submit a job (the spec dict of the REST body), mapped to the wire by the scheduler
    client's one spec mapping. Not retried: a retry after a lost answer could start it twice."""
    scheduler = gw.scheduler()  # Unimplemented / Unavailable before anything is mapped
    from microco.clients.scheduler import spec_to_pb

    return to_dict(scheduler.submit(spec_to_pb(spec)))


def cancel_job(gw: Gateway, job_id: str) -> dict[str, Any]:
    return to_dict(gw.scheduler().cancel(job_id))  # idempotent on the server: retried


def control_job(
    gw: Gateway, job_id: str, action: str, devices: list[str], device_count: int
) -> dict[str, Any]:
    return to_dict(gw.scheduler().control(job_id, action, devices, device_count))


def jobs_snapshot(gw: Gateway) -> list[dict[str, Any]]:
    """Every job as the scheduler reports it now (for the recorder)."""
    return [to_dict(j) for j in gw.scheduler().list()]


# --------------------------------------------------------------------------- cache


def _cache_stats_name(instance: str) -> str:
    return f"cache:{instance}:stats"


def cache_view(
    gw: Gateway, series: SeriesStore, limit: int = DEFAULT_PAGE, cursor: str = "", *, window_s: float = 3600.0
) -> dict[str, Any]:
    """Per cache server: capacity, use, datasets, allocations with reasons, hit rate over time."""
    ok, reason = gw.availability("cache")
    if not ok:
        return unavailable(reason, servers=[])
    servers = []
    start, gap = time.time() - window_s, _gap_s(gw)
    records, next_cursor = paginate(gw.services("cache"), lambda r: (r.instance_id,), limit, cursor)
    for record in records:
        entry: dict[str, Any] = {"instance_id": record.instance_id, "address": record.address, "error": ""}
        try:
            cache = gw.cache(record)
            entry["stats"] = to_dict(cache.stats())
            entry["allocations"] = to_dict(cache.allocations()).get("allocations", [])
        except MicrocoError as exc:
            entry["error"] = str(exc)
        entry["hit_rate"] = mark_gaps(
            in_window(hit_rate_series(series.read(_cache_stats_name(record.instance_id), last=500)), start),
            gap,
        )
        jobs = set(per_job_counters(entry.get("stats") or {})) | set(
            (entry.get("stats") or {}).get("jobs") or []
        )
        entry["job_hit_rate"] = {
            job: mark_gaps(points, gap)
            for job in sorted(jobs)
            if (
                points := in_window(
                    hit_rate_series(series.read(_cache_job_stats_name(record.instance_id, job), last=500)),
                    start,
                )
            )
        }
        servers.append(entry)
    return {
        "available": True,
        "reason": "",
        "servers": servers,
        "at": time.time(),
        "next_cursor": next_cursor,
    }


def _cache_job_stats_name(instance: str, job: str) -> str:
    return f"cache:{instance}:job:{job}:stats"


def per_job_counters(stats: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per-job hit and miss counters in a cache server's stats, when the server reports them: any
    list of entries carrying a job id with ``hits`` and ``misses`` (none in today's CacheStats, so
    the per-job plot stays empty and the page says so until the cache reports them)."""
    out: dict[str, dict[str, int]] = {}
    for value in stats.values():
        if not isinstance(value, list):
            continue
        for item in value:
            if not isinstance(item, dict) or "hits" not in item or "misses" not in item:
                continue
            job = item.get("job_id") or item.get("job")
            if job:
                out[str(job)] = {"hits": int(item["hits"]), "misses": int(item["misses"])}
    return out


def cache_samples(gw: Gateway) -> list[tuple[str, dict[str, Any]]]:
    """(series name, {hits, misses, ...}) for every cache server, and every job a server reports
    counters for, now (for the recorder)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for record in gw.services("cache"):
        try:
            stats = to_dict(gw.cache(record).stats())
        except MicrocoError:
            continue
        out.append(
            (
                _cache_stats_name(record.instance_id),
                {
                    "hits": stats.get("hits", 0),
                    "misses": stats.get("misses", 0),
                    "used_bytes": stats.get("used_bytes", 0),
                },
            )
        )
        for job, counters in per_job_counters(stats).items():
            out.append((_cache_job_stats_name(record.instance_id, job), counters))
    return out


# --------------------------------------------------------------------------- store


def store_view(
    gw: Gateway, series: SeriesStore, limit: int = DEFAULT_PAGE, cursor: str = "", *, window_s: float = 3600.0
) -> dict[str, Any]:
    """Tables with their three replicas' partitioning, the store nodes and their health, and
    recovery progress when the coordinator reports it."""
    ok, reason = gw.availability("store")
    if not ok:
        return unavailable(reason, tables=[], nodes=[], recovery=None)
    store = gw.store()
    tables, next_cursor = paginate(
        (to_dict(t) for t in store.list_tables_pb().tables),
        lambda t: (str(t.get("name", "")),),
        limit,
        cursor,
    )
    nodes = [to_dict(n) for n in store.nodes_pb().nodes]
    for t in tables:
        t.pop("placement_json", None)  # per-extent placement is on the table's own endpoint
    recovery: Any = None
    try:
        recovery = _unfold_json(to_dict(store.recovery_pb()))
    except MicrocoError as exc:
        recovery = {"error": str(exc)}
    return {
        "available": True,
        "reason": "",
        "tables": tables,
        "nodes": nodes,
        "recovery": recovery,
        "recovery_history": mark_gaps(
            in_window(series.read(STORE_RECOVERY_SERIES, last=500), time.time() - window_s), _gap_s(gw)
        ),
        "at": time.time(),
        "next_cursor": next_cursor,
    }


STORE_RECOVERY_SERIES = "store:recovery"
_RECOVERY_FIGURES = ("unavailable_extents", "lost_extents", "rebuilt", "bytes_lost", "bytes_read")


def store_recovery_sample(gw: Gateway) -> dict[str, Any] | None:
    """The coordinator's recovery figures now (for the recorder), or None when it has none."""
    rec = _unfold_json(to_dict(gw.store().recovery_pb()))
    out = {k: rec[k] for k in _RECOVERY_FIGURES if isinstance(rec.get(k), int | float)}
    if "state" in rec:
        out["state"] = str(rec["state"])
    return out or None


def _unfold_json(d: dict[str, Any]) -> dict[str, Any]:
    """Services that pass a JSON document in a string field (``json``, ``placement_json``): the
    console serves it as JSON, not as a string inside JSON."""
    out = dict(d)
    for k in [k for k in out if k == "json" or k.endswith("_json")]:
        raw = out.pop(k)
        name = k.removesuffix("_json") if k != "json" else "detail"
        try:
            value = json.loads(raw) if raw else None
        except (TypeError, ValueError):
            value = raw
        if name == "detail" and isinstance(value, dict):
            out = {**value, **out}
        else:
            out[name] = value
    return out


def store_table(gw: Gateway, name: str) -> dict[str, Any]:
    """One table with its per-super-extent placement (replica -> partition -> node)."""
    store = gw.store()  # Unimplemented when not in this build
    return _unfold_json(to_dict(store.get_table_pb(name, placement=True)))


def _jsonable(value: Any) -> Any:
    """A cell of a query result as JSON: dates as ISO text, bytes as hex, NaN as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, datetime.date | datetime.datetime | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def store_query(gw: Gateway, query: dict[str, Any], limit_rows: int, explain_only: bool) -> dict[str, Any]:
    """Run (or only explain) a query through the coordinator; at most ``limit_rows`` rows come back."""
    store = gw.store()
    if explain_only:
        resp = to_dict(store.explain_pb(query))
        return {
            "plan_kind": resp.get("plan_kind", ""),
            "explain": resp.get("text", ""),
            "replicas": _unfold_json(resp).get("replicas"),
            "columns": [],
            "rows": [],
            "row_count": 0,
            "truncated": False,
        }
    import pyarrow as pa

    # Memory follows the limit, not the result (2.1M rows for ``limit_rows: 1`` took the console
    # from 131 to 666 MB): the limit is pushed down to the store (one row more than shown, to know
    # that the result was cut), and the stream is decoded batch by batch and ended once enough
    # rows arrived.
    cap = limit_rows + 1
    query = dict(query)
    own = query.get("limit")
    if own is None or (isinstance(own, int) and not isinstance(own, bool) and own > cap):
        query["limit"] = cap
    first: dict[str, Any] = {}
    parts = store.query_pb(query, timeout=max(gw.config.rpc_timeout_s, 60.0))

    def chunks() -> Generator[bytes, None, None]:
        for k, part in enumerate(parts):
            if k == 0:
                first.update(_unfold_json(to_dict(part)))
            if part.arrow_ipc:
                yield part.arrow_ipc

    source = chunks()
    columns: list[str] = []
    rows: list[list[Any]] = []
    seen = 0
    try:
        raw = _ChunkReader(source)
        if raw.peek():
            reader = pa.ipc.open_stream(raw)
            columns = list(reader.schema.names)
            while seen < cap:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                take = batch.slice(0, max(0, limit_rows - len(rows)))
                rows += [[_jsonable(r[c]) for c in columns] for r in take.to_pylist()]
                seen += batch.num_rows
    finally:
        source.close()
        close = getattr(parts, "close", None)
        if close is not None:
            close()  # ends the gRPC stream when rows are left unread
    return {
        "plan_kind": first.get("plan_kind", ""),
        "explain": first.get("explain", ""),
        "replicas": first.get("replicas"),
        "columns": columns,
        "rows": rows,
        "row_count": len(rows),
        "truncated": seen > limit_rows,
    }


class _ChunkReader(io.RawIOBase):
    """The ``arrow_ipc`` parts of a Query stream as one file, read as Arrow asks for it."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def peek(self) -> bool:
        """Whether there is anything to read at all."""
        while not self._buf:
            nxt = next(self._chunks, None)
            if nxt is None:
                return False
            self._buf = memoryview(nxt)
        return True

    def readinto(self, b: Any) -> int:
        # Fills ``b`` across chunk boundaries: Arrow reads a message's declared length in one
        # call and takes a short read for a truncated stream.
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view) and self.peek():
            n = min(len(view) - done, len(self._buf))
            view[done : done + n] = self._buf[:n]
            self._buf = self._buf[n:]
            done += n
        return done


def store_start_recovery(gw: Gateway) -> dict[str, Any]:
    return _unfold_json(to_dict(gw.store().start_recovery_pb()))


# --------------------------------------------------------------------------- compiler


def _graph_summary(g: dict[str, Any]) -> dict[str, Any]:
    """The compiler's own figures (baseline, best, speedup) when it reports them; otherwise the
    first and the best measured trial."""
    trials = g.get("trials") or []
    measured = [t for t in trials if t.get("step_ms") and not t.get("failed")]
    first = float(g.get("baseline_ms") or (measured[0]["step_ms"] if measured else 0.0))
    best = float(g.get("best_ms") or min((float(t["step_ms"]) for t in measured), default=0.0))
    speedup = float(g.get("speedup") or ((first / best) if best else 0.0))
    return {**g, "first_step_ms": first, "best_step_ms": best, "speedup": speedup}


def compiler_view(gw: Gateway, limit: int = DEFAULT_PAGE, cursor: str = "") -> dict[str, Any]:
    """Every registered graph with its exploration (step time per trial), committed configuration
    and the speedup of the best configuration over the first one measured."""
    ok, reason = gw.availability("compiler")
    if not ok:
        return unavailable(reason, graphs=[])
    graphs, next_cursor = paginate(
        (to_dict(g) for g in gw.compiler().list_graphs()), lambda g: (str(g.get("key", "")),), limit, cursor
    )
    return {
        "available": True,
        "reason": "",
        "graphs": [_graph_summary(g) for g in graphs],
        "at": time.time(),
        "next_cursor": next_cursor,
    }


def compiler_graph(gw: Gateway, key: str) -> dict[str, Any]:
    compiler = gw.compiler()  # Unimplemented when not in this build
    return _graph_summary(to_dict(compiler.get_graph(key)))


# --------------------------------------------------------------------------- one job's links


def job_links(gw: Gateway, series: SeriesStore, job_id: str, *, window_s: float = 3600.0) -> dict[str, Any]:
    """One job across the systems: its timeline and scheduler history (as ``get_job``), its cache
    hits per dataset (every cache server's ``job_stats``) with its hit rate over the window per
    server, and the compiler graphs it registered (``_links.job_links`` joins them)."""
    job = get_job(gw, series, job_id, window_s=window_s)  # NotFound for an unknown job
    ok, reason = gw.availability("cache")
    cache: dict[str, Any] = {"available": ok, "reason": reason, "servers": []}
    hit_rate: dict[str, list[dict[str, Any]]] = {}
    if ok:
        start, gap = time.time() - window_s, _gap_s(gw)
        for record in gw.services("cache"):
            entry: dict[str, Any] = {"instance_id": record.instance_id, "error": ""}
            try:
                entry["stats"] = to_dict(gw.cache(record).stats())
            except MicrocoError as exc:
                entry["error"] = str(exc)
            cache["servers"].append(entry)
            points = in_window(
                hit_rate_series(series.read(_cache_job_stats_name(record.instance_id, job["id"]), last=500)),
                start,
            )
            if points:
                hit_rate[record.instance_id] = mark_gaps(points, gap)
    ok, reason = gw.availability("compiler")
    compiler: dict[str, Any] = {"available": ok, "reason": reason, "graphs": []}
    if ok:
        try:
            compiler["graphs"] = [_graph_summary(to_dict(g)) for g in gw.compiler().list_graphs()]
        except MicrocoError as exc:
            compiler = {"available": False, "reason": f"compiler: {exc}", "graphs": []}
    out = links.job_links(job, cache, compiler)
    if out["cache"]["available"]:
        out["cache"]["hit_rate_series"] = hit_rate
    out["at"] = time.time()
    return out
