"""The simulator's jobs as the live scheduler's records (``JobRecord``).

The simulator keeps its jobs in a mutable, slotted class for speed (a run updates them tens of
thousands of times); at its boundary it shows them as the one record type the live scheduler
stores in etcd. ``job_records`` is what a live scheduler would hold for the cluster the
simulator shows its policy now: written to etcd and read back by ``SchedulerCore.observe``, it
gives the policy the same ``ClusterView`` (``tests/integration/scheduler/test_policy_parity.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .._jobs import HOLDING, new_record, validate_spec
from .._record import GrowTrial, JobRecord
from ..policy import JobView
from ._engine import Simulator

# A simulated job runs no process: its record names this command (never started).
SIM_COMMAND = ("simulated",)


def job_record(view: JobView, node_of: Mapping[str, str]) -> JobRecord:
    """The live record of the job the policy sees as ``view`` (``node_of``: device -> node)."""
    spec = validate_spec(
        {
            "name": view.id,
            "command": list(SIM_COMMAND),
            "devices": view.devices_wanted,
            "elastic": view.elastic,
            "priority": view.priority,
            "user": view.owner,
            "total_steps": view.total_steps or 0,
            "model": view.model,
            "max_devices": view.max_devices or 0,
            "gpu_share": view.gpu_share,
        },
        None,
        check_command=False,
    )
    state = view.state.value
    holding = state in HOLDING and bool(view.devices)
    return replace(
        new_record(spec, now=view.submitted_at),
        id=view.id,
        state=state,
        devices=tuple(view.devices) if holding else (),
        node=node_of[view.devices[0]] if holding else "",
        step=view.steps_done,
        attained_service_s=view.attained_service_s,
        minibatch_ms=view.minibatch_ms or 0.0,
        minibatch_ms_alone=view.minibatch_ms_alone or 0.0,
        utilization=view.utilization,
        packed_with=tuple(view.packed_with),
        last_change_at=view.last_change_at,
        first_step_at=view.submitted_at if view.minibatch_ms else 0.0,
        grow_trial=None
        if view.grown_from is None
        else GrowTrial(
            tuple(view.grown_from),
            view.minibatch_ms_before_grow,
            view.grown_at_step,
            view.minibatch_trend_before_grow,
        ),
        max_useful_devices=view.max_useful_devices,
        step_at_change=view.steps_done,
        settled_ms=None
        if view.minibatch_ms_settled is None
        else (view.steps_done, view.minibatch_ms_settled),
        early_trend=view.minibatch_trend_settled,
    )


def job_records(sim: Simulator) -> list[JobRecord]:
    """The records of the jobs the simulator's policy sees now (queued, running, suspended)."""
    view = sim.view()
    node_of = {d.id: d.node for d in view.devices}
    return [job_record(j, node_of) for j in view.jobs]
