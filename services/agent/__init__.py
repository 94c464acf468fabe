"""microco.services.agent: the node agent of one host.

Registers the host's devices (GPUs, or virtual CPU-share devices) under an etcd lease at
``/microco/nodes/<node>``, starts job processes with their device assignment and environment,
relays the scheduler's control (suspend / resume / checkpoint / stop / resize) to the job's
hook through a control directory, and reports each process's progress and exit.
"""

from microco.clients.agent import NODES_PREFIX

from ._devices import DeviceInfo, discover_devices
from ._procs import ManagedProcess, ProcessManager
from ._runas import ENV_RUN_AS, JobUser, resolve_run_as
from ._service import NodeAgent, NodeAgentServicer

__all__ = [
    "ENV_RUN_AS",
    "NODES_PREFIX",
    "DeviceInfo",
    "JobUser",
    "ManagedProcess",
    "NodeAgent",
    "NodeAgentServicer",
    "ProcessManager",
    "discover_devices",
    "resolve_run_as",
]
