"""Discrete-event simulator for the scheduler policies, on public traces.

The simulator drives the *same* policy objects as the live scheduler
(``microco.services.scheduler.policy``); it only replaces the mechanism: a virtual clock, a
cluster model, a job-progress model with Gavel's measured packing interference, and a cost
model for suspend/resume/migration. See docs/scheduler-sim.md.
"""

from ._baselines import (
    TIRESIAS_TWO_QUEUES,
    FractionalSharing,
    SharingConfig,
    baseline_policies,
    sharing_policy,
)
from ._engine import LOAD_FRACTION, ClusterSpec, SimResult, Simulator, contended_window, load_window, simulate
from ._generate import poisson_trace
from ._hpsearch import (
    HP_MODEL,
    TARGET_QUANTILE,
    AshaPromotion,
    AshaSearcher,
    HPSearchResult,
    PromotionSearchResult,
    asha_rungs,
    hp_search_trace,
    run_asha_promotion,
    run_hp_search,
    target_loss,
)
from ._models import UNKNOWN_MODEL_CHOICES, UnknownModelError, parse_model_map_item, read_model_map
from ._perf import COST_PROFILES, CostModel, PerfModel, default_perf_model
from ._trace import (
    GAVEL_FAMILIES,
    PAI_JOB_COLUMNS,
    PAI_STATUSES,
    PAI_TASK_COLUMNS,
    TRACE_COLUMNS,
    PhillyDurations,
    TraceError,
    TraceJob,
    default_traces_dir,
    load_alibaba,
    load_pai,
    load_philly,
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
    "PAI_JOB_COLUMNS",
    "PAI_STATUSES",
    "PAI_TASK_COLUMNS",
    "TARGET_QUANTILE",
    "TIRESIAS_TWO_QUEUES",
    "TRACE_COLUMNS",
    "UNKNOWN_MODEL_CHOICES",
    "AshaPromotion",
    "AshaSearcher",
    "ClusterSpec",
    "CostModel",
    "FractionalSharing",
    "HPSearchResult",
    "PerfModel",
    "PhillyDurations",
    "PromotionSearchResult",
    "SharingConfig",
    "SimResult",
    "Simulator",
    "TraceError",
    "TraceJob",
    "UnknownModelError",
    "asha_rungs",
    "baseline_policies",
    "contended_window",
    "default_perf_model",
    "default_traces_dir",
    "hp_search_trace",
    "load_alibaba",
    "load_pai",
    "load_philly",
    "load_tiresias",
    "load_trace",
    "load_window",
    "parse_model_map_item",
    "poisson_trace",
    "read_model_map",
    "read_trace_csv",
    "run_asha_promotion",
    "run_hp_search",
    "sharing_policy",
    "simulate",
    "target_loss",
    "write_trace_csv",
]
