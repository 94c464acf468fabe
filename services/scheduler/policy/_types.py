"""Observed state and decisions: the whole vocabulary between a mechanism and a policy.

Everything here is a frozen dataclass so a view can be shared, hashed, compared in tests
and handed to a policy without fear that the policy changes the mechanism's state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class JobPhase(str, enum.Enum):
    """Where a job is in its life. A ``str`` enum so it serialises as its value."""

    QUEUED = "queued"  # submitted, never ran (or requeued from scratch)
    RUNNING = "running"  # holds its devices alone
    SUSPENDED = "suspended"  # ran, checkpointed at a mini-batch boundary, holds nothing
    PACKED = "packed"  # shares at least one device with another job
    MIGRATING = "migrating"  # checkpointing on old devices / restoring on new ones
    FINISHED = "finished"
    FAILED = "failed"


#: Phases in which a job holds devices (its ``devices`` field is meaningful).
HOLDING_PHASES = frozenset({JobPhase.RUNNING, JobPhase.PACKED, JobPhase.MIGRATING})
#: Phases in which a job waits for devices.
WAITING_PHASES = frozenset({JobPhase.QUEUED, JobPhase.SUSPENDED})
#: Phases a job never leaves.
TERMINAL_PHASES = frozenset({JobPhase.FINISHED, JobPhase.FAILED})


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One accelerator as the scheduler sees it.

    ``kind`` is the class of device ("gpu", or "virtual" for a CPU share on a host without
    GPUs); ``model`` the device model ("v100", "p100", "k80", "T4"...), used for speed and
    interference lookups; "" when unknown.
    """

    id: str
    node: str
    kind: str = "gpu"
    model: str = ""


@dataclass(frozen=True)  # no slots: frozen+slots construction is ~2.5x slower
class JobView:
    """One job as the scheduler observes it.

    Units: times in seconds on the mechanism's clock; ``attained_service_s`` is the service
    the job has received so far in *device-seconds* (wall seconds holding devices times the
    number of devices held, as Tiresias counts it); ``minibatch_ms`` is the recent observed
    mean mini-batch time (None until reported) and ``minibatch_ms_alone`` the job's time
    when it had its devices to itself (profiled or first observed; None if unknown).

    Optional fields beyond the contract (all defaulted, so older callers keep working):
    ``gpu_share`` is the fraction of one device the job keeps busy when alone (1.0 when
    unknown; the Alibaba trace's fractional GPU requests, or a measured utilisation);
    ``max_devices`` caps how far an elastic job may grow (None: the policy decides);
    ``utilization`` is the observed (profiled) fraction of one device the job keeps busy
    when it runs alone, e.g. from device telemetry or, in the simulator, from Gavel's
    measurements (None = unknown: policies fall back to ``gpu_share``, the request).
    ``grown_from`` .. ``max_useful_devices`` let a policy judge a grow by measured throughput.
    """

    id: str
    devices_wanted: int
    elastic: bool = False
    priority: int = 0
    owner: str = ""
    submitted_at: float = 0.0
    state: JobPhase = JobPhase.QUEUED
    devices: tuple[str, ...] = ()
    attained_service_s: float = 0.0
    minibatch_ms: float | None = None
    minibatch_ms_alone: float | None = None
    steps_done: int = 0
    total_steps: int | None = None
    packed_with: tuple[str, ...] = ()
    last_change_at: float = 0.0
    model: str = ""
    gpu_share: float = 1.0
    max_devices: int | None = None
    utilization: float | None = None
    # A grow being judged (elastic jobs): the devices before it and the mini-batch time
    # measured there; ``minibatch_ms_settled`` is the time measured wholly since the job's
    # last change (None until enough mini-batches ran). ``max_useful_devices``: a grow to
    # that many did not pay, so the job is not grown to it again.
    grown_from: tuple[str, ...] | None = None
    minibatch_ms_before_grow: float | None = None
    minibatch_ms_settled: float | None = None
    # Session 43: the trend of the job's mini-batch time, as the mechanism fits it to its
    # recent readings: (the step they are centred on, their mean, the slope in ms per step,
    # the slope's standard error): ``minibatch_trend_before_grow``, of its latest times when
    # it was grown at step ``grown_at_step``; ``minibatch_trend_settled``, of its first times
    # since its last change (those nearest it), fitted with the settled time. None where
    # unmeasured (a simulator's exact times have none).
    grown_at_step: int | None = None
    minibatch_trend_before_grow: tuple[float, float, float, float] | None = None
    minibatch_trend_settled: tuple[float, float, float, float] | None = None
    max_useful_devices: int | None = None
    # False for a job that cannot be suspended, moved or resized at a mini-batch boundary (it
    # runs without the scheduler's hook): it keeps its devices until it ends.
    preemptible: bool = True
    # The training data the job reads, as the shared cache names it ("" when unknown). Jobs
    # that read the same dataset are served from one cached copy when they run at the same
    # time; ``gandiva``'s ``dataset_affinity`` uses it (docs/codesign.md).
    dataset: str = ""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """A consistent snapshot: the clock, every usable device and every non-terminal job.

    Terminal jobs may be included; policies ignore them.
    """

    now: float
    devices: tuple[DeviceView, ...]
    jobs: tuple[JobView, ...]


# ----------------------------------------------------------------------------- decisions
# A closed set. The mechanism applies a list of decisions in order; a decision may use
# devices freed by an earlier decision of the same list (e.g. Suspend then Resume).


@dataclass(frozen=True, slots=True)
class Start:
    """Start a QUEUED job on ``devices`` (which must be free once earlier decisions apply)."""

    job_id: str
    devices: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Suspend:
    """Checkpoint a running/packed job at a mini-batch boundary and free its devices."""

    job_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Resume:
    """Restore a SUSPENDED job on ``devices`` (free once earlier decisions apply)."""

    job_id: str
    devices: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Pack:
    """Start or resume a waiting job on ``devices`` already held by ``with_jobs``.

    Afterwards the job and every job in ``with_jobs`` are PACKED (share a device).
    """

    job_id: str
    devices: tuple[str, ...]
    with_jobs: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Unpack:
    """Take a PACKED job off its shared devices (it becomes SUSPENDED); the jobs it shared
    with continue, RUNNING again once they are alone."""

    job_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Migrate:
    """Checkpoint a holding job and resume it on ``devices`` (same count; may overlap)."""

    job_id: str
    devices: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Resize:
    """Give an elastic holding job a new device set (grow or shrink; any overlap kept)."""

    job_id: str
    devices: tuple[str, ...]
    reason: str = ""


Decision = Start | Suspend | Resume | Pack | Unpack | Migrate | Resize
DECISION_TYPES: tuple[type, ...] = (Start, Suspend, Resume, Pack, Unpack, Migrate, Resize)


class PolicyError(ValueError):
    """Bad policy name or configuration."""
