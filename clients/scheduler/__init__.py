"""Job-side hooks for the microco scheduler (Gandiva).

A training script adds a few lines (``TorchHook`` for a PyTorch loop, ``SchedulerCallback``
for Keras' ``fit``) and then reports every mini-batch's time and obeys the scheduler at
mini-batch boundaries: suspend (checkpoint, free the device, park), resume, checkpoint-and-move
(checkpoint and exit with ``EXIT_CHECKPOINTED`` so it can restart elsewhere) and resize.
Frameworks are imported lazily: importing this package imports neither torch nor TensorFlow.
"""

from typing import Any

from ._control import (
    ACTIONS,
    CHECKPOINT,
    EXIT_CHECKPOINTED,
    RESIZE,
    RESUME,
    STOP,
    SUSPEND,
    ControlChannel,
)
from ._data import StepBatches
from ._job import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_CONTROL_DIR,
    ENV_DEVICES,
    ENV_JOB_ID,
    ENV_RANK,
    ENV_TOTAL_STEPS,
    ENV_WORLD_SIZE,
    JobContext,
)
from ._keras import SchedulerCallback
from ._phases import (
    PHASES,
    PHASES_PREFIX,
    JobPhase,
    PhasePublisher,
    job_phases,
    phase_key,
    read_phases,
    watch_phases,
)
from ._ranks import classify_exit, read_records
from ._torch import TorchHook, average_gradients, init_distributed, seed_everything

_CLIENT_NAMES = ("SchedulerClient", "job_to_dict", "make_spec", "state_name")
# The job spec's wire mapping (protobuf only), shared by the scheduler service, CLI and console.
_SPEC_NAMES = ("SPEC_KEYS", "spec_from_pb", "spec_to_pb")


def __getattr__(name: str) -> Any:
    # The gRPC client is loaded on first use: a training process importing the hooks should
    # not pay for gRPC's import at every (re)start.
    if name in _CLIENT_NAMES:
        from . import _client

        return getattr(_client, name)
    if name in _SPEC_NAMES:
        from . import _spec

        return getattr(_spec, name)
    raise AttributeError(name)


__all__ = [
    "ACTIONS",
    "CHECKPOINT",
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_DIR",
    "ENV_CONTROL_DIR",
    "ENV_DEVICES",
    "ENV_JOB_ID",
    "ENV_RANK",
    "ENV_TOTAL_STEPS",
    "ENV_WORLD_SIZE",
    "EXIT_CHECKPOINTED",
    "PHASES",
    "PHASES_PREFIX",
    "RESIZE",
    "RESUME",
    "SPEC_KEYS",
    "STOP",
    "SUSPEND",
    "ControlChannel",
    "JobContext",
    "JobPhase",
    "PhasePublisher",
    "SchedulerCallback",
    "SchedulerClient",
    "StepBatches",
    "TorchHook",
    "average_gradients",
    "classify_exit",
    "init_distributed",
    "job_phases",
    "job_to_dict",
    "make_spec",
    "phase_key",
    "read_phases",
    "read_records",
    "seed_everything",
    "spec_from_pb",
    "spec_to_pb",
    "state_name",
    "watch_phases",
]
