"""microco.clients.agent: the node agents as their callers see them.

Where each agent registers its host's devices in etcd (:data:`NODES_PREFIX`) and
:class:`AgentDirectory`, the one typed client of the agents' gRPC API that the scheduler, the CLI
and the console share (live nodes, control of job processes, reading a job's log from whichever
node keeps it).
"""

from ._directory import CONTROL, NODES_PREFIX, AgentDirectory

__all__ = ["CONTROL", "NODES_PREFIX", "AgentDirectory"]
