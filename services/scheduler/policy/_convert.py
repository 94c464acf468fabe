"""Plain-dict <-> view/decision conversion, shared by the live scheduler and the simulator
so both build a policy's input the same way (and a test can feed both the same state),
plus a checker that a decision list is applicable to a view."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ._types import (
    DECISION_TYPES,
    HOLDING_PHASES,
    WAITING_PHASES,
    ClusterView,
    Decision,
    DeviceView,
    JobPhase,
    JobView,
    Migrate,
    Pack,
    PolicyError,
    Resize,
    Resume,
    Start,
    Suspend,
    Unpack,
)

_JOB_FIELDS = {f.name for f in dataclasses.fields(JobView)}
_DEV_FIELDS = {f.name for f in dataclasses.fields(DeviceView)}
_DECISION_BY_KIND = {t.__name__.lower(): t for t in DECISION_TYPES}


def device_view_from_dict(d: Mapping[str, Any]) -> DeviceView:
    """Build a DeviceView from a dict with keys id, node[, kind, model]; extra keys ignored."""
    return DeviceView(**{k: v for k, v in d.items() if k in _DEV_FIELDS})


def job_view_from_dict(d: Mapping[str, Any]) -> JobView:
    """Build a JobView from a dict of its fields (``state`` as a JobPhase or its value,
    ``devices``/``packed_with`` as any sequence); extra keys are ignored, so a stored job
    record can be passed as it is."""
    kw = {k: v for k, v in d.items() if k in _JOB_FIELDS}
    if "id" not in kw or "devices_wanted" not in kw:
        raise PolicyError("a job needs at least 'id' and 'devices_wanted'")
    kw["id"] = str(kw["id"])
    kw["devices_wanted"] = int(kw["devices_wanted"])
    if "state" in kw:
        kw["state"] = JobPhase(kw["state"])
    for key in ("devices", "packed_with"):
        if key in kw:
            kw[key] = tuple(str(x) for x in (kw[key] or ()))
    if kw.get("grown_from") is not None:
        kw["grown_from"] = tuple(str(x) for x in kw["grown_from"])
    for key in ("minibatch_trend_before_grow", "minibatch_trend_settled"):
        if kw.get(key) is not None:
            kw[key] = tuple(float(x) for x in kw[key])
    if kw.get("grown_at_step") is not None:
        kw["grown_at_step"] = int(kw["grown_at_step"])
    if "dataset" in kw:
        kw["dataset"] = str(kw["dataset"] or "")
    for key in ("submitted_at", "attained_service_s", "last_change_at", "gpu_share", "utilization"):
        if key in kw and kw[key] is not None:
            kw[key] = float(kw[key])
    return JobView(**kw)


def cluster_view_from_dicts(
    now: float, devices: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]]
) -> ClusterView:
    """The one way to build a ClusterView from plain data (live scheduler, simulator, tests).

    Devices keep the given order; jobs are sorted by id so that the same set of jobs gives
    the same view whatever order the caller's store returned them in.
    """
    devs = tuple(device_view_from_dict(d) for d in devices)
    js = tuple(sorted((job_view_from_dict(j) for j in jobs), key=lambda j: j.id))
    return ClusterView(now=float(now), devices=devs, jobs=js)


def cluster_view_to_dict(view: ClusterView) -> dict[str, Any]:
    """JSON-able form of a view (inverse of :func:`cluster_view_from_dicts`)."""

    def job(j: JobView) -> dict[str, Any]:
        d = dataclasses.asdict(j)
        d["state"] = j.state.value
        d["devices"] = list(j.devices)
        d["packed_with"] = list(j.packed_with)
        return d

    return {
        "now": view.now,
        "devices": [dataclasses.asdict(d) for d in view.devices],
        "jobs": [job(j) for j in view.jobs],
    }


def decision_to_dict(d: Decision) -> dict[str, Any]:
    """``{"kind": "start", "job_id": ..., ...}`` with tuples as lists."""
    out: dict[str, Any] = {"kind": type(d).__name__.lower()}
    for f in dataclasses.fields(d):
        v = getattr(d, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def decision_from_dict(d: Mapping[str, Any]) -> Decision:
    """Inverse of :func:`decision_to_dict`."""
    try:
        cls = _DECISION_BY_KIND[str(d["kind"]).lower()]
    except KeyError:
        raise PolicyError(f"unknown decision kind in {dict(d)!r}") from None
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name in d:
            v = d[f.name]
            kw[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**kw)


def check_decisions(view: ClusterView, decisions: Iterable[Decision]) -> list[str]:
    """Problems applying ``decisions`` in order to ``view`` (empty list: all applicable).

    Checks what a mechanism must check before acting: the job exists and is in a phase the
    decision applies to, no job is acted on twice, devices exist, Start/Resume/Migrate/
    Resize only take devices that are free (after earlier decisions) or already the job's,
    and Pack only shares devices held by the jobs it names.
    """
    jobs = {j.id: j for j in view.jobs}
    node_devs = {d.id for d in view.devices}
    holders: dict[str, set[str]] = {d: set() for d in node_devs}
    for j in view.jobs:
        if j.state in HOLDING_PHASES:
            for dev in j.devices:
                holders.setdefault(dev, set()).add(j.id)
    state = {j.id: j.state for j in view.jobs}
    held = {j.id: tuple(j.devices) if j.state in HOLDING_PHASES else () for j in view.jobs}
    problems: list[str] = []
    seen: set[str] = set()

    def free_for(job_id: str, devs: tuple[str, ...]) -> str | None:
        if len(set(devs)) != len(devs):
            return "repeats a device"
        for dev in devs:
            if dev not in node_devs:
                return f"unknown device {dev}"
            if holders[dev] - {job_id}:
                return f"device {dev} is held by {sorted(holders[dev] - {job_id})}"
        return None

    def move(job_id: str, devs: tuple[str, ...]) -> None:
        for dev in held[job_id]:
            holders[dev].discard(job_id)
        for dev in devs:
            holders[dev].add(job_id)
        held[job_id] = devs

    for d in decisions:
        if not isinstance(d, DECISION_TYPES):
            problems.append(f"not a decision: {d!r}")
            continue
        jid = d.job_id
        tag = f"{type(d).__name__}({jid})"
        if jid not in jobs:
            problems.append(f"{tag}: unknown job")
            continue
        if jid in seen:
            problems.append(f"{tag}: job acted on twice in one round")
        seen.add(jid)
        st = state[jid]
        if isinstance(d, (Start, Resume)):
            want = JobPhase.QUEUED if isinstance(d, Start) else JobPhase.SUSPENDED
            if st is not want:
                problems.append(f"{tag}: job is {st.value}, not {want.value}")
            if not d.devices:
                problems.append(f"{tag}: no devices")
            why = free_for(jid, tuple(d.devices))
            if why:
                problems.append(f"{tag}: {why}")
            else:
                move(jid, tuple(d.devices))
                state[jid] = JobPhase.RUNNING
        elif isinstance(d, Pack):
            if st not in WAITING_PHASES:
                problems.append(f"{tag}: job is {st.value}, not waiting")
            for dev in d.devices:
                if dev not in node_devs:
                    problems.append(f"{tag}: unknown device {dev}")
                elif not holders[dev] or not holders[dev] <= set(d.with_jobs):
                    problems.append(f"{tag}: device {dev} not held (only) by {list(d.with_jobs)}")
            if all(dev in node_devs for dev in d.devices):
                move(jid, tuple(d.devices))
                state[jid] = JobPhase.PACKED
        elif isinstance(d, (Suspend, Unpack)):
            if st not in HOLDING_PHASES:
                problems.append(f"{tag}: job is {st.value}, holds nothing")
            if isinstance(d, Unpack) and st is not JobPhase.PACKED:
                problems.append(f"{tag}: job is {st.value}, not packed")
            move(jid, ())
            state[jid] = JobPhase.SUSPENDED
        elif isinstance(d, (Migrate, Resize)):
            if st not in HOLDING_PHASES:
                problems.append(f"{tag}: job is {st.value}, holds nothing")
            if isinstance(d, Migrate) and len(d.devices) != len(held[jid]):
                problems.append(f"{tag}: migrate must keep the device count")
            if isinstance(d, Resize) and not jobs[jid].elastic:
                problems.append(f"{tag}: job is not elastic")
            if isinstance(d, Resize) and len(d.devices) < 1:
                problems.append(f"{tag}: resize to no devices")
            why = free_for(jid, tuple(d.devices))
            if why:
                problems.append(f"{tag}: {why}")
            else:
                move(jid, tuple(d.devices))
    return problems
