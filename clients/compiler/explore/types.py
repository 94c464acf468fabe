"""Plain data the exploration core, the service and the clients share (no framework imports)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

# Stages: structural rewrites are cheap to try (coarse), compiled regions cost compile time,
# thread counts and options are fine tuning explored last around the best structure.
STAGE_STRUCTURE = 0
STAGE_COMPILE = 1
STAGE_FINE = 2

# Variables whose best choice depends on what else runs on the machine (the intra-op thread
# count): a committed choice of one is re-validated when a later run finds another load.
LOAD_DEPENDENT = ("threads",)


@dataclass(frozen=True)
class Variable:
    """One adaptive variable: ``choices[0]`` is the baseline (what eager execution does).

    ``region`` names the region the variable acts on ("" = the whole step); variables of
    different regions are independent and are explored together. ``compiles`` marks a variable
    whose non-baseline choices cost compile time before they pay off.
    """

    name: str
    choices: tuple[str, ...]
    region: str = ""
    stage: int = STAGE_STRUCTURE
    compiles: bool = False
    # What one compile of this variable costs before any was measured (ms; 0 = the core's
    # default for the framework): a whole unrolled step compiles far longer than one cell.
    compile_prior_ms: float = 0.0
    # True when ``compile_prior_ms`` is already calibrated by the client (e.g. TensorFlow prices
    # XLA by the HLO size it will compile times a rate measured on this hardware): the core then
    # uses it as given until the choice itself is measured, and neither scales it by this key's
    # other compiles nor lets its measured cost scale theirs (two estimators, two calibrations).
    prior_calibrated: bool = False
    # Variables that have no effect while this one is off its baseline: ``model.compile``
    # (dynamo + Inductor over the cells' plain code) makes every region rewrite inert. The core
    # treats configurations that differ only in subsumed variables as one (their baseline).
    subsumes: tuple[str, ...] = ()
    # Where ``compile_prior_ms`` holds only for some configurations ("name=choice" each: a cache
    # hit found for the memory format and thread count the probe ran under), what a compile costs
    # in any other (a cold compile: Dynamo recompiles for the other strides or threads); 0 there
    # = the framework's default, calibrated. Empty: the prior holds for every configuration.
    prior_holds_for: tuple[str, ...] = ()
    prior_otherwise_ms: float = 0.0
    # The speedup this host measured for this variable's compiled choice on this graph (the
    # interleaved A/B of an earlier run, kept with its compile costs; 0: never measured): the
    # core then expects that saving, not its optimistic bound times ``expected_gain_share``.
    # (Not on the wire, as ``prior_holds_for``: a remote core uses the bound.)
    measured_speedup: float = 0.0
    # Where none was measured: the speedup the client expects of the compiled choice from this
    # run's own eager step (its profile's share outside the GEMM-like kernels, under the
    # client's gain rule, ``_gain_rule``; issue 18, session 29; 0: no estimate). The core then
    # expects that saving in place of its optimistic bound times ``expected_gain_share``. (Not on
    # the wire either.)
    expected_speedup: float = 0.0
    # Where the compiled choice runs the step's vendor kernels as another configuration runs them
    # ("name=choice" each): Inductor on the CPU lays every convolution out channels-last whatever
    # the model's memory format (its layout optimisation), so a compiled step of a convolutional
    # model runs its convolutions as ``memory_format=channels_last`` does. Where the exploration
    # measured that configuration (the best's values with these) slower than the best, the
    # compile's expected saving is taken from the slower step (issue 18, session 35). Empty: the
    # compile runs the best's kernels. (Not on the wire, as ``expected_speedup``.)
    runs_as: tuple[str, ...] = ()

    def holds_for(self, values: dict[str, str]) -> bool:
        """Does ``compile_prior_ms`` price a compile of this variable in configuration ``values``?"""
        return all(values.get(k) == c for k, _, c in (h.partition("=") for h in self.prior_holds_for))

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a variable needs a name")
        if len(self.choices) < 1 or len(set(self.choices)) != len(self.choices):
            raise ValueError(f"variable {self.name!r} needs distinct choices, got {self.choices!r}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["choices"] = list(self.choices)
        if not self.prior_calibrated:  # absent when off: older states and fingerprints unchanged
            d.pop("prior_calibrated")
        if self.subsumes:
            d["subsumes"] = list(self.subsumes)
        else:
            d.pop("subsumes")
        if self.prior_holds_for:  # absent when unconditional: older states and fingerprints unchanged
            d["prior_holds_for"] = list(self.prior_holds_for)
        else:
            d.pop("prior_holds_for")
            d.pop("prior_otherwise_ms")
        if not self.measured_speedup:  # absent when never measured: older states unchanged
            d.pop("measured_speedup")
        if not self.expected_speedup:  # absent without an estimate: older states unchanged
            d.pop("expected_speedup")
        if self.runs_as:  # absent when empty: older states unchanged
            d["runs_as"] = list(self.runs_as)
        else:
            d.pop("runs_as")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Variable:
        return cls(
            d["name"],
            tuple(d["choices"]),
            d.get("region", ""),
            int(d.get("stage", 0)),
            bool(d.get("compiles", False)),
            float(d.get("compile_prior_ms", 0.0)),
            bool(d.get("prior_calibrated", False)),
            tuple(d.get("subsumes", ())),
            tuple(d.get("prior_holds_for", ())),
            float(d.get("prior_otherwise_ms", 0.0)),
            float(d.get("measured_speedup", 0.0)),
            float(d.get("expected_speedup", 0.0)),
            tuple(d.get("runs_as", ())),
        )


@dataclass(frozen=True)
class GraphSpec:
    """What a client registers: a captured graph, its inputs, the hardware and its variables."""

    fingerprint: str
    input_shapes: str
    hardware: str
    variables: tuple[Variable, ...]
    model_name: str = ""
    framework: str = "torch"
    total_steps: int = 1000  # how long the run expects to be: the budget exploration must repay

    @property
    def key(self) -> str:
        """The identity of an exploration: graph fingerprint + input shapes + hardware."""
        return graph_key(self.fingerprint, self.input_shapes, self.hardware)


def graph_key(fingerprint: str, input_shapes: str, hardware: str) -> str:
    digest = hashlib.sha256(f"{fingerprint}|{input_shapes}|{hardware}".encode()).hexdigest()
    return digest[:24]


@dataclass(frozen=True)
class Config:
    """The configuration for the next ``steps`` mini-batches (the first one warms up/compiles)."""

    key: str
    values: dict[str, str]
    trial: int
    committed: bool = False
    steps: int = 0  # 0 once committed: run it for ever, report nothing
    # No trial can run now (every planned one waits for a compile running in the background):
    # run ``values`` (the best so far) for up to ``steps`` mini-batches, or until the background
    # compiles finish, then report those steps as trial ``HOLD_TRIAL``. Not exploration.
    hold: bool = False


# The trial number of the steps a client ran under a hold configuration.
HOLD_TRIAL = -2


@dataclass
class TrialReport:
    """What a client measured running one trial's mini-batches."""

    trial: int
    step_ms: list[float]
    region_ms: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    error: str = ""
    # The trial cannot run yet: its compiled choices are compiling in the background (the client
    # keeps training under the best configuration meanwhile). For a HOLD_TRIAL report: the
    # background compiles are still running (False: they are done, the deferred trials can run).
    pending: bool = False
    # Runnable threads on the client's machine (its own included), sampled at the end of each
    # measured step and averaged (0: not measured). A trial measured with more of them than the
    # best's ran beside other work.
    runnable: float = 0.0
    # Each step's CPU time on the thread that ran it (ms), where the whole step ran on that one
    # thread (one intra-op thread, CPU tensors); empty where not measured. What the interleaved
    # A/B judges by when both sides carry it (issue 18, fourth session of 2026-12-02): it leaves
    # out the time other processes held the core. On the gRPC wire too
    # (``ReportTimingsRequest.step_cpu_ms``): a remote explorer judges as a local one does.
    step_cpu_ms: list[float] = field(default_factory=list)


def excess_ms(steps: list[float], cpu: list[float], base_ms: float, base_cpu_ms: float | None) -> float:
    """What ``steps`` cost the run beyond as many steps at the baseline's ``base_ms``. Where every
    step carries its thread CPU time (``cpu``, as long as ``steps``) and the baseline's typical
    CPU step is known (``base_cpu_ms``), each step is judged by it, as the interleaved A/B is,
    and expressed at the baseline's wall speed: ``(cpu / base_cpu - 1) x base_ms``. A step that
    waited while other processes held the core (a 100 ms stall beside a 3 ms step on a busy
    machine) is not the configuration's cost; counted in wall time, one such stall spent a
    whole run's exploration budget (0.03 x 400 steps x 2.8 ms = 34 ms) after one trial."""
    if base_cpu_ms is not None and base_cpu_ms > 0 and cpu and len(cpu) == len(steps):
        return sum((c / base_cpu_ms - 1.0) * base_ms for c in cpu)
    return sum(steps) - len(steps) * base_ms
