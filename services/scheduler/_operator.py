"""Operator commands on a job: suspend (and hold), resume, migrate, resize.

The API checks a command against the job's stored state at once (a clear FAILED_PRECONDITION
for a transition the state does not allow), then records it on the job (``operator``), as
cancellation records ``cancel_requested``; the leader carries it out at its next tick with the
same mechanism as the policy's decisions (so a suspended job parks at a mini-batch boundary,
a migrated one checkpoints and restarts, a resized one re-pins). A suspend or migrate sent
before the job's process has finished its first mini-batch waits, recorded, for that first
boundary. A job an operator suspended is *held*: the policy does not resume it until an
operator does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from microco.common.errors import FailedPrecondition, InvalidArgument, MicrocoError

from . import _jobs as J
from ._nodes import NodeIO
from ._record import JobRecord, OperatorRequest
from ._store import JobStore
from .policy import Migrate, Resize, Resume, Suspend

if TYPE_CHECKING:
    from ._actions import DecisionApplier

ACTIONS = ("suspend", "resume", "migrate", "resize")
_RUNNING = (J.RUNNING, J.PACKED)


def check(rec: JobRecord, action: str, devices: list[str], count: int, cluster: set[str]) -> None:
    """Raise a clear error if ``action`` does not fit the job now."""
    jid, st = rec.id, rec.state
    if action not in ACTIONS:
        raise InvalidArgument(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    if st in J.TERMINAL or rec.cancel_requested:
        raise FailedPrecondition(
            f"cannot {action} job {jid}: it is {st}{' (cancel requested)' if st not in J.TERMINAL else ''}"
        )
    pending = rec.operator
    if pending:
        raise FailedPrecondition(f"cannot {action} job {jid}: a {pending.action} is still to be carried out")
    if rec.no_hook and action in ("suspend", "migrate", "resize"):
        raise FailedPrecondition(
            f"cannot {action} job {jid}: it runs without the scheduler's hook (no report since it "
            "started), so it cannot stop at a mini-batch boundary"
        )
    unknown = [d for d in devices if d not in cluster]
    if unknown:
        raise InvalidArgument(f"devices {unknown} are not in the cluster (it has {sorted(cluster)})")
    if len(set(devices)) != len(devices):
        raise InvalidArgument(f"devices {devices} name a device twice")
    if action == "suspend":
        if st not in _RUNNING:
            raise FailedPrecondition(f"cannot suspend job {jid}: it is {st}, not running")
    elif action == "resume":
        if st not in (J.SUSPENDED, J.QUEUED) or (st == J.QUEUED and not rec.held):
            why = "not suspended" if st != J.QUEUED else "queued (the policy starts it)"
            raise FailedPrecondition(
                f"cannot resume job {jid}: it is {why if st == J.QUEUED else f'{st}, {why}'}"
            )
        if devices and len(devices) != rec.spec.devices and not rec.spec.elastic:
            raise InvalidArgument(f"job {jid} runs on {rec.spec.devices} devices, not {len(devices)}")
    elif action == "migrate":
        if st not in _RUNNING:
            raise FailedPrecondition(f"cannot migrate job {jid}: it is {st}, not running")
        if not devices:
            raise InvalidArgument("migrate needs the devices to move to (--devices)")
        if len(devices) != len(rec.devices):
            raise InvalidArgument(
                f"migrate keeps the job's size ({len(rec.devices)} devices, not {len(devices)}); use resize"
            )
    elif action == "resize":
        if st != J.RUNNING:
            raise FailedPrecondition(f"cannot resize job {jid}: it is {st}, not running alone")
        if not rec.spec.elastic:
            raise FailedPrecondition(f"cannot resize job {jid}: it was not submitted as elastic")
        if not devices and count <= 0:
            raise InvalidArgument("resize needs the devices (--devices) or a device count")


def request(
    store: JobStore,
    cluster: set[str],
    clock: Callable[[], float],
    job_id: str,
    action: str,
    devices: list[str],
    count: int,
) -> JobRecord:
    """Record an operator's command on the job (checked first); the leader carries it out."""

    def ask(rec: JobRecord) -> JobRecord:
        check(rec, action, list(devices), int(count), cluster)
        return replace(
            rec,
            operator=OperatorRequest(action, tuple(devices), int(count), clock()),
            message=f"{action} requested by an operator",
        )

    return store.change(job_id, ask)


def carry_out(actions: DecisionApplier, rec: JobRecord, now: float) -> JobRecord:
    """The leader's side: apply the recorded command (refusals go into the job's history).
    Returns the job's record as it is after (also in the tick's table)."""
    store = actions.store
    req = rec.operator or OperatorRequest("")
    jid = rec.id
    if req.action in _AT_BOUNDARY and _before_first_boundary(actions, rec):
        # Held, not refused: the job's process has not finished a mini-batch yet, so it has no
        # boundary to stop at. The command stays recorded and is carried out at the first tick
        # after the job reports one; a job that never reports becomes ``no_hook`` and the
        # command is then refused by ``check`` with the reason.
        waiting = f"{req.action} requested by an operator: waits for the job's first mini-batch boundary"
        return rec if rec.message == waiting else store.keep(replace(rec, message=waiting))
    rec = store.keep(replace(rec, operator=None))
    action, devices = req.action, list(req.devices)
    try:
        check(rec, action, devices, req.count, {d["id"] for d in actions.io.cluster_devices()})
        if action == "suspend":
            store.keep(replace(rec, held=True))
            actions.apply(Suspend(jid, "operator: suspend (held until an operator resumes it)"), now)
        elif action == "resume":
            rec = store.keep(replace(rec, held=False))
            if devices:
                actions.apply(Resume(jid, tuple(devices), "operator: resume"), now)
            else:
                store.keep(rec.noted("resumed by an operator: the policy places it", now))
        elif action == "migrate":
            actions.apply(Migrate(jid, tuple(devices), "operator: migrate"), now)
        elif action == "resize":
            target = devices or _resize_devices(actions.io, actions, rec, req.count)
            actions.apply(Resize(jid, tuple(target), "operator: resize"), now)
    except MicrocoError as exc:
        store.keep(store.jobs[jid].noted(f"operator {action} refused: {exc}", now))
    return store.jobs[jid]


_AT_BOUNDARY = ("suspend", "migrate")


def _before_first_boundary(actions: DecisionApplier, rec: JobRecord) -> bool:
    """A running job (with the hook, as far as known) whose process has no mini-batch yet."""
    return (
        rec.state in _RUNNING
        and not rec.no_hook
        and not rec.cancel_requested
        and rec.pending is None
        and not actions.reached_boundary(rec)
    )


def _resize_devices(io: NodeIO, actions: DecisionApplier, rec: JobRecord, count: int) -> list[str]:
    """``count`` devices on the job's node: its own first, then free ones."""
    own = list(rec.devices)
    if count <= len(own):
        return own[:count]
    busy = actions.occupied()
    node_devs = [d["id"] for d in (io.nodes.get(rec.node) or {}).get("devices", [])]
    free = [d for d in node_devs if d not in own and not (busy.get(d, set()) - {rec.id})]
    if len(own) + len(free) < count:
        raise FailedPrecondition(
            f"node {rec.node} has {len(free)} free devices: the job cannot grow from {len(own)} to {count}"
        )
    return own + free[: count - len(own)]
