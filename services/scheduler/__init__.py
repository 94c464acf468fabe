"""microco.services.scheduler: the Gandiva scheduler service.

``SchedulerCore`` is the mechanism (job store in etcd, the leader's control loop carrying out
policy decisions through node agents); ``Scheduler`` adds leader election and the gRPC API.
The policies live in :mod:`microco.services.scheduler.policy`, the simulator in
:mod:`microco.services.scheduler.sim`.
"""

from ._core import SchedulerCore
from ._jobs import JOBS_PREFIX, record_to_pb, spec_from_pb, validate_spec
from ._local import spawn_agent, spawn_scheduler, stop_process
from ._service import Scheduler, SchedulerServicer, load_policy_config

__all__ = [
    "JOBS_PREFIX",
    "Scheduler",
    "SchedulerCore",
    "SchedulerServicer",
    "load_policy_config",
    "record_to_pb",
    "spawn_agent",
    "spawn_scheduler",
    "spec_from_pb",
    "stop_process",
    "validate_spec",
]
