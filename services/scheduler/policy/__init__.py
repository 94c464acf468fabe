"""Scheduling policies: pure functions from observed cluster state to decisions.

The mechanism (the live scheduler service or the simulator) builds a :class:`ClusterView`,
calls ``policy.decide(view)`` and carries out the returned decisions in order, refusing any
that have gone stale. Policies are looked up by name::

    from microco.services.scheduler.policy import make_policy, cluster_view_from_dicts
    policy = make_policy("gandiva", quantum_s=60, enable_packing=False)
    view = cluster_view_from_dicts(now, devices=[{"id": "g0", "node": "n0"}], jobs=[...])
    for decision in policy.decide(view): ...

Registered: ``fifo`` (exclusive, first come first served), ``las`` (Tiresias-style least
attained service with preemption), ``gandiva`` (time-slicing, introspective packing,
migration, grow-shrink, each switchable).
"""

from ._convert import (
    check_decisions,
    cluster_view_from_dicts,
    cluster_view_to_dict,
    decision_from_dict,
    decision_to_dict,
    device_view_from_dict,
    job_view_from_dict,
)
from ._fifo import FifoConfig, FifoPolicy
from ._gandiva import GandivaConfig, GandivaPolicy, busy_fraction, grow_judgement, packed_progress
from ._index import ClusterIndex, HolderTable, IndexedClusterView, index_of
from ._las import LasConfig, LasPolicy
from ._next import next_to_run
from ._registry import Policy, available_policies, make_policy, policy_config_type, register_policy
from ._types import (
    DECISION_TYPES,
    HOLDING_PHASES,
    TERMINAL_PHASES,
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
from ._validate import JobFacts, Refusal, Rejection, check

__all__ = [
    "DECISION_TYPES",
    "HOLDING_PHASES",
    "TERMINAL_PHASES",
    "WAITING_PHASES",
    "ClusterIndex",
    "ClusterView",
    "Decision",
    "DeviceView",
    "FifoConfig",
    "FifoPolicy",
    "GandivaConfig",
    "GandivaPolicy",
    "HolderTable",
    "IndexedClusterView",
    "JobFacts",
    "JobPhase",
    "JobView",
    "LasConfig",
    "LasPolicy",
    "Migrate",
    "Pack",
    "Policy",
    "PolicyError",
    "Refusal",
    "Rejection",
    "Resize",
    "Resume",
    "Start",
    "Suspend",
    "Unpack",
    "available_policies",
    "busy_fraction",
    "check",
    "check_decisions",
    "cluster_view_from_dicts",
    "cluster_view_to_dict",
    "decision_from_dict",
    "decision_to_dict",
    "device_view_from_dict",
    "grow_judgement",
    "index_of",
    "job_view_from_dict",
    "make_policy",
    "next_to_run",
    "packed_progress",
    "policy_config_type",
    "register_policy",
]
