"""microco.clients.compiler.explore: Astra's exploration core, shared by both ends.

The core (:func:`start`, :func:`next_config`, :func:`report` over an :class:`Exploration`) is
pure; :class:`CompilerCore` keeps explorations and committed configurations in a KV store
(etcd); :class:`LocalExplorer` runs the same core inside the training process when no compiler
service is used. :mod:`.types` and :mod:`.wire` are the vocabulary and its protobuf mapping.
The compiler service (:mod:`microco.services.compiler`) is a thin gRPC adapter over
:class:`CompilerCore`; the wrapper in the training process imports this package, never the
service.
"""

from ._core import Exploration, ExplorationPolicy, TrialRecord, commit, next_config, report, start
from ._records import trial_records
from ._store import COMMITTED, EXPLORATIONS, CompilerCore, LocalExplorer, committed_record
from .types import (
    HOLD_TRIAL,
    STAGE_COMPILE,
    STAGE_FINE,
    STAGE_STRUCTURE,
    Config,
    GraphSpec,
    TrialReport,
    Variable,
    graph_key,
)

__all__ = [
    "COMMITTED",
    "EXPLORATIONS",
    "HOLD_TRIAL",
    "STAGE_COMPILE",
    "STAGE_FINE",
    "STAGE_STRUCTURE",
    "CompilerCore",
    "Config",
    "Exploration",
    "ExplorationPolicy",
    "GraphSpec",
    "LocalExplorer",
    "TrialRecord",
    "TrialReport",
    "Variable",
    "commit",
    "committed_record",
    "graph_key",
    "next_config",
    "report",
    "start",
    "trial_records",
]
