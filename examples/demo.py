"""The demo scenario `make demo` (``microco up --demo``) runs once the platform is healthy.

It goes through every system the way a team would use them:

1. **Quiver**: the scikit-learn digits are written as one file per sample and registered with
   the cache by content hash (registering the same bytes again, as another user, changes nothing).
2. **Gandiva + Quiver + Astra**: training jobs (``microco.examples.demo_job``: an LSTM over the
   digits' rows) are submitted to the scheduler; the node agent runs them on virtual devices,
   each reads its data through the cache and runs its training steps under the compiler
   service's configurations. More jobs than devices, so the scheduler has to share.
   The last job is elastic (it may grow onto idle devices, and is shrunk back if that does
   not pay); when a device is free while a job has work ahead, the demo migrates that job
   there as an operator would (``microco job migrate``).
3. **Instalytics**: a table is stored as three replicas partitioned on three columns; a group-by
   on a partitioning column runs shuffle-free on its replica, one on another column shuffles,
   and EXPLAIN says which and why.

It ends with a one-screen summary (``_demo_summary``): every mechanism, whether this run
showed it, and the evidence the systems recorded.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from microco.examples import _demo_summary as S

Say = Callable[[str], None]


def write_digits(root: Path) -> int:
    """The digits as one file per sample (label byte + 64 float32 pixels). Idempotent."""
    from microco.examples._digits import load_digits
    from microco.examples.demo_job import encode_sample

    xs, ys = load_digits()
    root.mkdir(parents=True, exist_ok=True)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        path = root / f"{i // 256:02d}" / f"digit-{i:05d}.bin"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(encode_sample(int(y), x.reshape(-1)))
    return len(xs)


def step_cache(kv: Any, home: Path, say: Say) -> dict[str, Any]:
    from microco.clients.cache import register_dataset

    root = home / "datasets" / "digits"
    n = write_digits(root)
    rec, _index = register_dataset(kv, "digits", str(root), owner="alice")
    say(
        f"cache: registered 'digits' ({n} samples, {rec.num_chunks} chunks, {rec.total_bytes} bytes), "
        f"index {rec.index_digest[:12]}"
    )
    again, _ = register_dataset(kv, "digits", str(root), owner="bob")
    say(f"cache: bob registers the same bytes -> same index {again.index_digest[:12]} (shared, not copied)")
    return {"samples": n, "digest": rec.index_digest, "shared": again.index_digest == rec.index_digest}


def _free_device(sched: Any, rows: list[dict]) -> str:
    """A device no job of the cluster holds now ("" if none)."""
    from microco.clients.scheduler import job_to_dict

    jobs = [job_to_dict(j) for j in sched.list()] + rows
    held = {d for j in jobs if j["state"] in ("running", "packed", "migrating") for d in j["devices"]}
    free = [d.id for d in sched.list_nodes().devices if d.id not in held]
    return free[0] if free else ""


def _maybe_migrate(sched: Any, rows: list[dict], total_steps: int, say: Say) -> bool:
    """The operator's migration: a one-device job with work ahead moves onto a free device at
    a mini-batch boundary (on one node the process is re-pinned in place; across nodes it
    restarts from its checkpoint). True once asked."""
    from microco.common.errors import MicrocoError

    movable = [
        r
        for r in rows
        if r["state"] == "running" and not r["elastic"] and r["first_step_at"] and r["step"] < total_steps - 5
    ]
    if not movable:
        return False
    free = _free_device(sched, rows)
    if not free:
        return False
    job = movable[0]
    try:
        sched.control(job["id"], "migrate", [free])
    except MicrocoError as exc:  # e.g. it just finished or the device was taken: try later
        say(f"scheduler: migrate {job['name']} not done now: {exc}")
        return False
    say(f"scheduler: operator migrates {job['name']} from {','.join(job['devices'])} to {free}")
    return True


def step_training(
    kv: Any, etcd: str, home: Path, say: Say, jobs: int, epochs: int, samples: int = 0
) -> tuple[list[dict], list[dict]]:
    from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec

    out_dir = home / "demo"
    out_dir.mkdir(parents=True, exist_ok=True)
    sched = SchedulerClient.from_etcd(kv)
    ids = []
    for k in range(jobs):
        elastic = jobs > 1 and k == jobs - 1
        out = out_dir / f"job-{k}.json"
        out.unlink(missing_ok=True)
        spec = make_spec(
            [
                sys.executable,
                "-m",
                "microco.examples.demo_job",
                "--etcd",
                etcd,
                "--epochs",
                str(epochs),
                "--seed",
                str(k),
                "--user",
                "alice" if k % 2 == 0 else "bob",
                "--out",
                str(out),
            ],
            devices=1,
            name=f"digits-lstm-{k}",
            user="alice" if k % 2 == 0 else "bob",
            env={"MICROCO_ETCD": etcd},
            model="digits-lstm",
            elastic=elastic,
            max_devices=2 if elastic else 0,
        )
        job = sched.submit(spec)
        ids.append((job.id, out))
        say(
            f"scheduler: submitted {spec.name} as {job.id}"
            + (" (elastic, up to 2 devices)" if elastic else "")
        )
    total_steps = -(-samples // 64) * epochs if samples else 0  # the demo job's batches of 64
    migrated = not total_steps
    last: dict[str, str] = {}
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        rows = [job_to_dict(sched.get(i)) for i, _ in ids]
        for r in rows:
            label = f"{r['state']} step {r['step']}"
            if last.get(r["id"], "").split(" step")[0] != r["state"]:
                devs = ",".join(r["devices"]) or "-"
                say(
                    f"scheduler: {r['name']} {label} on {devs}"
                    + (f" ({r['message']})" if r["message"] else "")
                )
            last[r["id"]] = label
        if all(r["state"] in ("finished", "failed", "cancelled") for r in rows):
            break
        if not migrated:
            migrated = _maybe_migrate(sched, rows, total_steps, say)
        time.sleep(1.0)
    results = []
    for (_job_id, out), r in zip(ids, rows, strict=True):
        res = json.loads(out.read_text()) if out.exists() else {}
        ttff = r["first_step_at"] - r["submitted_at"] if r["first_step_at"] else None
        results.append(
            {
                "job": r["name"],
                "state": r["state"],
                "time_to_first_step_s": ttff,
                **{
                    k: res.get(k)
                    for k in (
                        "steps",
                        "final_loss",
                        "cache_hit_rate",
                        "compiler_committed",
                        "compiler_explore_steps",
                    )
                },
            }
        )
    sched.close()
    return results, rows


def step_compiler(kv: Any, say: Say, model: str = "demo-digits-lstm") -> list[dict[str, Any]]:
    """The compiler's graphs of the demo's model (others' graphs are not the demo's)."""
    from microco.clients.compiler import RemoteExplorer

    explorer = RemoteExplorer.from_etcd(kv, default_timeout=10.0)
    graphs = []
    for g in explorer.list_graphs():
        if g.model_name != model:
            continue
        best = dict(g.best.values) if g.HasField("best") else {}
        say(
            f"compiler: {g.model_name or g.key[:16]}: {len(g.trials)} trials, "
            f"{'committed' if g.committed else 'exploring'} {best}"
        )
        graphs.append({"name": g.model_name, "trials": len(g.trials), "committed": g.committed, "best": best})
    explorer.close()
    return graphs


def step_store(kv: Any, say: Say, rows: int = 200_000) -> tuple[dict[str, dict[str, Any]], list[str]]:
    import numpy as np
    import pyarrow as pa

    from microco.clients.store import StoreClient

    store = StoreClient.from_etcd(kv)
    if any(t["name"] == "trips" for t in store.list_tables()):
        store.drop_table("trips")
    rng = np.random.default_rng(0)
    trips = pa.table(
        {
            "trip_id": pa.array(np.arange(rows, dtype=np.int64)),
            "rider_id": pa.array(rng.integers(0, 5_000, rows, dtype=np.int64)),
            "city": pa.array(rng.choice(["ams", "ber", "lis", "par", "sea", "sfo"], rows)),
            "fare": pa.array(np.round(rng.gamma(2.0, 9.0, rows), 2)),
            "day": pa.array(rng.integers(1, 31, rows, dtype=np.int64)),
        }
    )
    layouts = ["trip_id:hash:8", "rider_id:hash:8", "city:hash:4"]
    store.create_table("trips", trips.schema, layouts)
    t0 = time.monotonic()
    store.append("trips", trips)
    say(
        f"store: 'trips' stored as 3 replicas partitioned by trip_id, rider_id, city "
        f"({rows} rows, {time.monotonic() - t0:.1f}s)"
    )
    top = (
        store.table("trips")
        .group_by("rider_id")
        .agg(spend=("sum", "fare"), n=("count", "*"))
        .order_by("spend", descending=True)
        .limit(3)
    )
    t0 = time.monotonic()
    result = store.query(top)
    plans = {"group-by rider_id": dict(store.last_plan)}
    say(
        f"store: top riders by spend ({store.last_plan.get('kind')}, {time.monotonic() - t0:.2f}s, "
        f"{store.last_plan.get('moved_bytes', 0)} bytes shuffled): {result.to_pylist()}"
    )
    say("store: EXPLAIN\n" + store.explain(top))
    by_city = store.table("trips").filter("fare", ">", 50.0).group_by("city").agg(n=("count", "*"))
    t0 = time.monotonic()
    result = store.query(by_city)
    say(
        f"store: long trips per city ({store.last_plan.get('kind')}, {time.monotonic() - t0:.2f}s, "
        f"{store.last_plan.get('moved_bytes', 0)} bytes shuffled): "
        f"{sorted(result.to_pylist(), key=lambda r: r['city'])}"
    )
    by_day = store.table("trips").group_by("day").agg(revenue=("sum", "fare")).order_by("day").limit(3)
    t0 = time.monotonic()
    result = store.query(by_day)
    plans["group-by day"] = dict(store.last_plan)
    say(
        f"store: revenue by day, a column no replica is partitioned on ({store.last_plan.get('kind')}, "
        f"{time.monotonic() - t0:.2f}s, {store.last_plan.get('moved_bytes', 0)} bytes shuffled): "
        f"{result.to_pylist()}"
    )
    say("store: EXPLAIN\n" + store.explain(by_day))
    store.close()
    for plan in plans.values():
        plan.pop("explain", None)
    return plans, [layout.split(":")[0] for layout in layouts]


def _store_node_pid(home: Path, node: str) -> int:
    """The pid of store node ``node`` (its registered name) in the stack's state file, or 0."""
    from microco.common.discovery import STATE_FILE

    try:
        state = json.loads((Path(home) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return 0
    for p in state.get("processes", []):
        if node in (p.get("instance_id"), p.get("name")) and p.get("name", "").startswith("store-node"):
            return int(p.get("pid") or 0)
    return 0


def step_store_recovery(kv: Any, home: Path, say: Say, timeout_s: float = 180.0) -> dict[str, Any]:
    """Kill a store node that holds part of 'trips' and watch the coordinator rebuild what it
    held onto the others (a query meanwhile is served degraded, and after it gives the same
    answer). Needs a node outside the fault domains of every extent's other copies, which the
    stack's default of six store nodes has; with fewer the step says so instead of killing."""
    import os
    import signal

    from microco.clients.store import StoreClient

    store = StoreClient.from_etcd(kv)
    try:
        nodes = [n for n in store.nodes() if n["alive"]]
        if len(nodes) < 6:
            # Every row has a copy in each replica, and replicas partition differently: with
            # fewer than three groups of two nodes a lost extent's rows have copies on every
            # other node, and the coordinator has nowhere to rebuild it (it would say "stuck").
            why = f"{len(nodes)} store nodes, fewer than 6: nowhere to rebuild a lost copy"
            say(f"store: no node killed ({why})")
            return {"done": False, "why": why}
        victim = max(nodes, key=lambda n: n["extents"])
        pid = _store_node_pid(home, victim["name"])
        if not pid:
            why = f"{victim['name']} was not started by this stack"
            say(f"store: no node killed ({why})")
            return {"done": False, "why": why}
        query = store.table("trips").group_by("city").agg(n=("count", "*")).order_by("city")
        before = store.query(query).to_pylist()
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        say(
            f"store: killed {victim['name']} (pid {pid}, {victim['extents']} extents, {victim['fault_domain']})"
        )
        rec: dict[str, Any] = {}
        seen_loss = False
        while time.monotonic() - t0 < timeout_s:
            rec = store.recovery()
            seen_loss = seen_loss or rec.get("unavailable_extents", 0) > 0 or rec.get("state") == "running"
            if seen_loss and rec.get("unavailable_extents", 0) == 0 and rec.get("state") in ("done", "idle"):
                break
            if rec.get("state") == "stuck":
                break
            time.sleep(0.5)
        after = store.query(query).to_pylist()
        done = seen_loss and rec.get("unavailable_extents", 1) == 0 and rec.get("state") != "stuck"
        say(
            f"store: recovery {rec.get('state', '?')}: {rec.get('rebuilt', 0)} of {rec.get('lost_extents', 0)} "
            f"extents rebuilt in {time.monotonic() - t0:.1f}s; the same answer after it: {after == before}"
        )
        return {
            "done": bool(done and after == before),
            "node": victim["name"],
            "rebuilt": rec.get("rebuilt", 0),
            "lost": rec.get("lost_extents", 0),
            "state": rec.get("state", ""),
            "same_answer": after == before,
        }
    finally:
        store.close()


def run_demo(
    etcd: str, redis: str, home: Path, progress: Say | None = None, jobs: int = 5, epochs: int = 3
) -> dict:
    """Run the scenario against a running platform; returns what it measured."""
    from microco.common.kv import EtcdKV

    say = progress or print
    home = Path(home)
    kv = EtcdKV(etcd)
    try:
        say("demo 1/3: Quiver — register a dataset by content")
        cache = step_cache(kv, home, say)
        say(f"demo 2/3: Gandiva + Quiver + Astra — {jobs} training jobs on the cluster")
        results, records = step_training(kv, etcd, home, say, jobs, epochs, cache["samples"])
        for r in results:
            say("  " + json.dumps(r))
        graphs = step_compiler(kv, say)
        say("demo 3/3: Instalytics — an analytics table with three layouts")
        plans, layouts = step_store(kv, say)
        recovery = step_store_recovery(kv, home, say)
        devices = _device_count(kv)
    finally:
        kv.close()
    rows = [
        *S.scheduler_rows(records, devices),
        S.cache_row(cache["shared"], cache["digest"], [r.get("cache_hit_rate") for r in results]),
        S.store_row(plans, layouts),
        S.recovery_row(recovery),
        S.compiler_row(graphs),
    ]
    say("demo summary (what the systems recorded in this run):\n" + "\n".join(S.summary_lines(rows)))
    say("demo finished")
    return {"jobs": results, "summary": rows}


def _device_count(kv: Any) -> int:
    from microco.clients.scheduler import SchedulerClient

    sched = SchedulerClient.from_etcd(kv)
    try:
        return len(sched.list_nodes().devices)
    finally:
        sched.close()
