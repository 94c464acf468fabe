"""Discrete-event simulator for the scheduler policies, on public traces.

The simulator drives the *same* policy objects as the live scheduler
(``microco.services.scheduler.policy``); it only replaces the mechanism: a virtual clock, a
cluster model, a job-progress model with Gavel's measured packing interference, and a cost
model for suspend/resume/migration. See docs/scheduler-sim.md.
"""

from ._engine import LOAD_FRACTION, ClusterSpec, SimResult, Simulator, contended_window, load_window, simulate
from ._hpsearch import HP_MODEL, AshaSearcher, HPSearchResult, asha_rungs, hp_search_trace, run_hp_search
from ._perf import COST_PROFILES, CostModel, PerfModel, default_perf_model
from ._trace import (
    GAVEL_FAMILIES,
    TRACE_COLUMNS,
    PhillyDurations,
    TraceError,
    TraceJob,
    default_traces_dir,
    load_alibaba,
    load_tiresias,
    load_trace,
    read_trace_csv,
    write_trace_csv,
)

__all__ = [
    "COST_PROFILES",
    "GAVEL_FAMILIES",
    "HP_MODEL",
    "LOAD_FRACTION",
    "TRACE_COLUMNS",
    "AshaSearcher",
    "ClusterSpec",
    "CostModel",
    "HPSearchResult",
    "PerfModel",
    "PhillyDurations",
    "SimResult",
    "Simulator",
    "TraceError",
    "TraceJob",
    "asha_rungs",
    "contended_window",
    "default_perf_model",
    "default_traces_dir",
    "hp_search_trace",
    "load_alibaba",
    "load_tiresias",
    "load_trace",
    "load_window",
    "read_trace_csv",
    "run_hp_search",
    "simulate",
    "write_trace_csv",
]
