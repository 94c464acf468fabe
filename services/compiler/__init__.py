"""microco.services.compiler: Astra's compiler service.

A thin gRPC adapter (:mod:`._servicer`) over :class:`CompilerCore`, the exploration core shared
with the training-side wrapper, which lives one layer down in
:mod:`microco.clients.compiler.explore` and is re-exported here for the service's callers.
"""

from microco.clients.compiler.explore import (
    COMMITTED,
    EXPLORATIONS,
    STAGE_COMPILE,
    STAGE_FINE,
    STAGE_STRUCTURE,
    CompilerCore,
    Config,
    Exploration,
    ExplorationPolicy,
    GraphSpec,
    LocalExplorer,
    TrialRecord,
    TrialReport,
    Variable,
    commit,
    committed_record,
    graph_key,
    next_config,
    report,
    start,
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
