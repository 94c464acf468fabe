"""The policy's input: a ``ClusterView`` built from the node records and the job records.

The live scheduler builds it each tick from its snapshot (``SchedulerCore.tick``), and from etcd
as it stands for tools (``SchedulerCore.observe``); the simulator builds the same view from its
own state (see ``sim``), and ``tests/integration/scheduler/test_policy_parity.py`` checks both
show a policy the same cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import _jobs as J
from ._profiles import Profiles
from ._record import JobRecord, Trend
from .policy import ClusterView, cluster_view_from_dicts


def settled_ms(rec: JobRecord) -> float | None:
    """The mini-batch time measured wholly since the job's last change, if there is one."""
    if rec.settled_ms and rec.settled_ms[0] == rec.step_at_change:
        return float(rec.settled_ms[1])
    return None


def settled_trend(rec: JobRecord, early: bool = False) -> Trend | None:
    """The trend of the job's latest mini-batch times (``early``: of its first ones since its
    last change), fitted with its settled time."""
    if settled_ms(rec) is None:
        return None
    return rec.early_trend if early else rec.settled_trend


def build_view(
    now: float,
    nodes: dict[str, dict[str, Any]],
    jobs: Iterable[JobRecord],
    profiles: Profiles,
    datasets: dict[str, str] | None = None,
) -> ClusterView:
    """``datasets``: the dataset each job reads (job id -> name), as the cache servers registered
    it; given only to a policy that asks for it (``reads_datasets``: dataset affinity)."""
    datasets = datasets or {}
    devices = []
    for name in sorted(nodes):
        for d in nodes[name].get("devices", []):
            devices.append(
                {"id": d["id"], "node": name, "kind": d.get("kind", "gpu"), "model": d.get("model", "")}
            )
    views = []
    for r in jobs:
        if r.terminal or r.cancel_requested:
            continue
        if r.held and not r.holding:
            continue  # suspended by an operator: not the policy's to resume
        v = J.record_to_view(r)
        if r.grow_trial is not None:
            v["grown_from"] = list(r.grow_trial.from_devices)
            v["minibatch_ms_before_grow"] = r.grow_trial.ms_before
            v["grown_at_step"] = r.grow_trial.at_step
            v["minibatch_trend_before_grow"] = r.grow_trial.trend
        v["minibatch_ms_settled"] = settled_ms(r)
        v["minibatch_trend_settled"] = settled_trend(r, early=True)
        v["max_useful_devices"] = r.max_useful_devices
        profiles.fill_view(r, v)  # what it has not measured yet, from earlier jobs like it
        v["preemptible"] = not r.no_hook
        v["dataset"] = datasets.get(r.id, "")
        views.append(v)
    return cluster_view_from_dicts(now, devices, views)
