"""microco.services.compiler: Astra's compiler service and its exploration core.

The core (:func:`start`, :func:`next_config`, :func:`report` over an :class:`Exploration`) is
pure; :class:`CompilerCore` keeps explorations and committed configurations in a KV store
(etcd); :class:`LocalExplorer` runs the same core in-process; the gRPC servicer is a thin
adapter over :class:`CompilerCore`.
"""

from ._core import Exploration, ExplorationPolicy, TrialRecord, commit, next_config, report, start
from ._store import COMMITTED, EXPLORATIONS, CompilerCore, LocalExplorer, committed_record
from ._types import (
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
]
