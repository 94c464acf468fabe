"""One check of a decision against the observed state, used by every mechanism that carries
decisions out: the live scheduler and the simulator refuse exactly the same decisions, for the
same reason, with the same code.

Modelled on the Kubernetes scheduler framework's ``Status{Code, Reason}``: a closed set of codes
a caller can act on (count, log, fail a test) and a sentence for people.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ._types import (
    HOLDING_PHASES,
    WAITING_PHASES,
    Decision,
    JobPhase,
    Migrate,
    Pack,
    Resize,
    Resume,
    Start,
    Suspend,
    Unpack,
)


class Refusal(str, enum.Enum):
    """Why a decision cannot be carried out now. Closed: a new reason is a new member."""

    UNKNOWN_JOB = "unknown_job"  # no such job, or it has ended
    NOT_WAITING = "not_waiting"  # Start needs a queued job, Resume a suspended one, Pack either
    NOT_RUNNING = "not_running"  # Suspend, Migrate and Resize need a job that holds devices
    NOT_PACKED = "not_packed"  # Unpack needs a packed job
    NO_DEVICES = "no_devices"  # a placement with no device
    DUPLICATE_DEVICE = "duplicate_device"  # the same device named twice
    UNKNOWN_DEVICE = "unknown_device"  # a device no live node has
    DEVICE_BUSY = "device_busy"  # held by a job the decision does not name
    NO_PARTNER = "no_partner"  # a Pack onto a device none of its named partners holds
    CHANGES_SIZE = "changes_size"  # a Migrate must keep the job's device count
    NOT_ELASTIC = "not_elastic"  # only elastic jobs are resized
    BELOW_REQUEST = "below_request"  # a Resize below the devices the job asked for
    UNKNOWN_DECISION = "unknown_decision"


@dataclass(frozen=True, slots=True)
class Rejection:
    code: Refusal
    reason: str

    def __str__(self) -> str:
        return f"{self.code.value}: {self.reason}"


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the check needs to know of the decision's job."""

    phase: JobPhase
    devices: tuple[str, ...] = ()
    devices_wanted: int = 1
    elastic: bool = False


def check(
    d: Decision,
    job: JobFacts | None,
    holders: Mapping[str, Collection[str]],
    device_known: Callable[[str], bool],
) -> Rejection | None:
    """None when ``d`` can be carried out on the state described, else why not.

    ``holders`` gives, for a device, the ids of the jobs holding it (a device nobody holds may
    be absent); ``device_known`` says whether a live node has the device."""

    def no(code: Refusal, reason: str) -> Rejection:
        return Rejection(code, f"{type(d).__name__} {getattr(d, 'job_id', '?')}: {reason}")

    if job is None:
        return no(Refusal.UNKNOWN_JOB, "no such job is active")
    if isinstance(d, Start | Resume | Pack):
        if isinstance(d, Pack):
            ok, want = job.phase in WAITING_PHASES, "queued or suspended"
        elif isinstance(d, Start):
            ok, want = job.phase is JobPhase.QUEUED, "queued"
        else:
            ok, want = job.phase is JobPhase.SUSPENDED, "suspended"
        if not ok:
            return no(Refusal.NOT_WAITING, f"the job is {job.phase.value}, not {want}")
        partners = set(d.with_jobs) if isinstance(d, Pack) else None
        return _devices(d, no, d.devices, {d.job_id}, holders, device_known, partners)
    if isinstance(d, Suspend | Unpack):
        if isinstance(d, Unpack) and job.phase is not JobPhase.PACKED:
            return no(Refusal.NOT_PACKED, f"the job is {job.phase.value}, not packed")
        if job.phase not in HOLDING_PHASES or not job.devices:
            return no(Refusal.NOT_RUNNING, f"the job is {job.phase.value} and holds no device")
        return None
    if isinstance(d, Migrate | Resize):
        if job.phase not in HOLDING_PHASES or not job.devices:
            return no(Refusal.NOT_RUNNING, f"the job is {job.phase.value} and holds no device")
        if isinstance(d, Migrate) and len(d.devices) != len(job.devices):
            return no(Refusal.CHANGES_SIZE, f"{len(job.devices)} devices cannot move onto {len(d.devices)}")
        if isinstance(d, Resize):
            if not job.elastic:
                return no(Refusal.NOT_ELASTIC, "the job is not elastic")
            if len(d.devices) < job.devices_wanted:
                return no(
                    Refusal.BELOW_REQUEST,
                    f"{len(d.devices)} devices, below the {job.devices_wanted} it asked for",
                )
        return _devices(d, no, d.devices, {d.job_id}, holders, device_known, None)
    return no(Refusal.UNKNOWN_DECISION, f"{d!r} is no decision this scheduler knows")


def _devices(
    d: Decision,
    no: Callable[[Refusal, str], Rejection],
    devices: tuple[str, ...],
    own: set[str],
    holders: Mapping[str, Collection[str]],
    device_known: Callable[[str], bool],
    partners: set[str] | None,
) -> Rejection | None:
    if not devices:
        return no(Refusal.NO_DEVICES, "no device named")
    if len(set(devices)) != len(devices):
        return no(Refusal.DUPLICATE_DEVICE, f"{', '.join(devices)} names a device twice")
    for dv in devices:
        if not device_known(dv):
            return no(Refusal.UNKNOWN_DEVICE, f"no live node has device {dv}")
        others = set(holders.get(dv, ())) - own
        if partners is None:
            if others:
                return no(Refusal.DEVICE_BUSY, f"device {dv} is held by {', '.join(sorted(others))}")
        elif not others:
            return no(Refusal.NO_PARTNER, f"none of {', '.join(sorted(partners))} holds device {dv}")
        elif others - partners:
            return no(Refusal.DEVICE_BUSY, f"device {dv} is held by {', '.join(sorted(others - partners))}")
    return None
