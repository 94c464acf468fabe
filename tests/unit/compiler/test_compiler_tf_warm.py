"""XLA compile prices per graph and per class, and trials' compiles abandoned at their deadline
(issue 18, session 11). Pure logic: no TensorFlow, nothing compiled, no timing asserted."""

from __future__ import annotations

import threading

import pytest
from _support import wait_until

from microco.clients.compiler import _compile_costs, _tf_warm
from microco.clients.compiler._tf_cost import COLD_MS_PER_INSTRUCTION, XlaCostModel, hlo_class
from microco.clients.compiler._tf_warm import XlaWarmer, compile_deadline_ms

RNN_HLO = """
ENTRY %main {
  %dot.1 = f32[16,64]{1,0} dot(f32[16,32]{1,0} %p0, f32[32,64]{1,0} %p1)
  %while.2 = (s32[], f32[16,64]{1,0}) while((s32[], f32[16,64]{1,0}) %t), condition=%c, body=%b
}
"""
CNN_HLO = """
ENTRY %main {
  %convolution.3 = f32[8,16,16,16]{3,2,1,0} convolution(f32[8,32,32,3]{3,2,1,0} %p0, f32[3,3,3,16]{3,2,1,0} %p1)
  %dot.4 = f32[8,10]{1,0} dot(f32[8,64]{1,0} %a, f32[64,10]{1,0} %b)
}
"""


@pytest.fixture(autouse=True)
def _no_load(monkeypatch):
    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)


def test_a_cnn_is_not_priced_by_the_rate_measured_on_recurrent_cells(tmp_path):
    """Found in the corpus: XLA's rate measured on recurrent cells priced MobileNetV3Small's step,
    which then compiled for minutes. Rates are kept per module class (its opcodes)."""
    rnn, cnn = hlo_class(RNN_HLO), hlo_class(CNN_HLO)
    assert rnn == "dot+while" and cnn == "convolution+dot" and hlo_class("ENTRY {}") == "elementwise"
    cost = XlaCostModel("cpu", tmp_path / "x.json")
    assert cost.observe(1_000, 500.0, "unrolled", graph="lstm", op_class=rnn)  # 0.5 ms per instruction
    assert cost.estimate(2_000, "unrolled", graph="gru", op_class=rnn) == pytest.approx(1_000.0)
    # Another class: the cold prior, not the recurrent rate.
    assert cost.estimate(2_000, "unrolled", graph="mobilenet", op_class=cnn) == pytest.approx(
        2_000 * COLD_MS_PER_INSTRUCTION
    )


def test_a_graph_measured_here_is_priced_by_its_own_compiles_and_an_abandoned_one_by_its_floor(tmp_path):
    path = tmp_path / "x.json"
    cost = XlaCostModel("cpu", path)
    assert cost.observe(1_000, 40_000.0, "unrolled", graph="mobilenet", op_class="convolution+dot")
    # Its own measurement, whatever its class's rate says for its size.
    assert cost.observe(1_000, 100.0, "unrolled", graph="other-cnn", op_class="convolution+dot")
    assert XlaCostModel("cpu", path).estimate(1_000, "unrolled", "mobilenet", "convolution+dot") == 40_000.0
    # Abandoned after 30 s: the graph costs at least that from then on (and no rate is learned).
    rates = cost.samples("unrolled", "resnet-class")
    cost.observe_abandoned("resnet", "unrolled", 30_000.0)
    again = XlaCostModel("cpu", path)
    assert again.measured("resnet", "unrolled") and not again.measured("resnet", "loop")
    assert again.estimate(10, "unrolled", "resnet", "resnet-class") == pytest.approx(30_000.0)
    assert again.samples("unrolled", "resnet-class") == rates
    # A compile that then finishes replaces the floor with its measure.
    assert again.observe(1_000, 50_000.0, "unrolled", graph="resnet", op_class="resnet-class")
    assert XlaCostModel("cpu", path).estimate(10, "unrolled", "resnet", "resnet-class") == 50_000.0


def test_the_deadline_is_a_multiple_of_the_price_bounded_by_what_the_run_can_save():
    assert compile_deadline_ms(1_000.0, 10**6, None) == _tf_warm.MIN_DEADLINE_MS
    assert compile_deadline_ms(20_000.0, 10**6, 10.0) == 20_000.0 * _tf_warm.DEADLINE_FACTOR
    # 300 steps left at 100 ms: at best 15 s saved, so the compile may not run longer.
    assert compile_deadline_ms(20_000.0, 300, 100.0) == pytest.approx(15_000.0)
    assert compile_deadline_ms(20_000.0, 0, 100.0) == 0.0


class _Concrete:
    captured_inputs: list[object] = []

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.calls = 0

    def _call_flat(self, args, captured):
        self.calls += 1
        self.release.wait(120)  # a compile that takes as long as the test lets it


class _Fn:
    def __init__(self, concrete: _Concrete) -> None:
        self.concrete = concrete

    def get_concrete_function(self, *args):
        return self.concrete


class _Owner:
    """What ``XlaWarmer`` asks of ``AstraTF``: the step variant of a configuration and its kind."""

    def __init__(self, deadline_ms: float) -> None:
        self.release = threading.Event()
        self.xla, self.plain = _Fn(_Concrete(self.release)), _Fn(_Concrete(self.release))
        self._called: set[int] = set()
        self._example = (1, 2)
        self.deadline_ms = deadline_ms
        self.abandoned: list[tuple[str, float]] = []
        self.compiled: list[tuple[str, float]] = []
        self.in_line = False  # what ``AstraTF.compiles_in_line`` answers

    def _mode(self, values):
        return (self.xla, "unrolled") if values.get("xla") == "plain" else (self.plain, "")

    def _all_variables(self):
        return []

    def _compile_deadline_ms(self, kind):
        return self.deadline_ms

    def compiles_in_line(self, kind):
        return self.in_line

    def _observe_abandoned_compile(self, kind, ms):
        self.abandoned.append((kind, ms))

    def _observe_background_compile(self, kind, ms):
        self.compiled.append((kind, ms))


def _wait(cond, seconds=60.0):
    wait_until(cond, seconds, interval=0.01)


def test_a_compile_past_its_deadline_is_abandoned_and_the_trial_no_longer_waits():
    owner = _Owner(deadline_ms=0.0)  # any compile is past it
    warmer = XlaWarmer(owner)
    try:
        assert warmer.ready({"xla": "off"})  # compiles nothing
        assert not warmer.ready({"xla": "plain"})
        warmer.start({"xla": "plain"})
        _wait(lambda: owner.xla.concrete.calls == 1)
        _wait(lambda: not warmer.busy())  # abandoned: the session stops holding for it
        assert id(owner.xla) in warmer.abandoned and "abandoned" in warmer.abandoned[id(owner.xla)]
        assert warmer.ready({"xla": "plain"})  # runs now: AstraTF.step fails it and runs the baseline
        assert [k for k, _ in owner.abandoned] == ["unrolled"] and not owner.compiled
        assert [e["outcome"] for e in warmer.log] == ["abandoned"]
    finally:
        owner.release.set()


def test_a_compile_done_before_its_deadline_is_measured_and_the_trial_runs_warm():
    owner = _Owner(deadline_ms=10**9)
    warmer = XlaWarmer(owner)
    warmer.start({"xla": "plain"})
    assert warmer.busy()
    owner.release.set()
    _wait(lambda: not warmer.busy())
    assert id(owner.xla) in warmer.done and warmer.ready({"xla": "plain"})
    assert [k for k, _ in owner.compiled] == ["unrolled"] and not owner.abandoned
    assert [e["outcome"] for e in warmer.log] == ["done"]


def test_a_compile_the_owner_runs_in_line_is_ready_at_once_and_never_launched():
    owner = _Owner(deadline_ms=10**9)
    owner.in_line = True
    warmer = XlaWarmer(owner)
    assert warmer.ready({"xla": "plain"})  # the trial runs now, compiling in its first step
    assert not warmer.busy() and owner.xla.concrete.calls == 0 and id(owner.xla) in warmer.inline
    assert [e["outcome"] for e in warmer.log] == ["in line"]


def test_a_compile_timed_by_its_cpu_is_priced_at_that_not_at_its_wall_over_the_load(tmp_path):
    """keras-sublstm (issue 18, 2026-12-03): its XLA compiles ran in the background beside the
    training, and their wall time over the load average priced it at 0.44-2.4 s alone (median
    1.0 s; 1.57 s the day before), a spread of 5x for one compile. A compile timed by the
    process's CPU time (in line) is its own work: it is kept apart and preferred, here and in
    the next run, to the wall-based samples, for the graph and for its class's rate."""
    path = tmp_path / "x.json"
    cost = XlaCostModel("cpu", path)
    for wall in (2_358.0, 1_004.0, 1_400.0):  # the wall-based samples of the host's record
        assert cost.observe(708, wall, "unrolled", graph="sublstm", op_class="dot+while")
    assert cost.estimate(708, "unrolled", "sublstm", "dot+while", at_load=False) == pytest.approx(1_400.0)
    assert cost.observe(708, 2_000.0, "unrolled", graph="sublstm", op_class="dot+while", cpu_ms=420.0)
    again = XlaCostModel("cpu", path)
    for model in (cost, again):
        assert model.estimate(708, "unrolled", "sublstm", "dot+while", at_load=False) == pytest.approx(420.0)
        # another graph of the class: the CPU-timed rate, not the wall-based ones
        assert model.estimate(1_416, "unrolled", "other", "dot+while") == pytest.approx(840.0)
        assert model.measured("sublstm", "unrolled")
    # A CPU time too small to be a compile (a cache hit) is not one: the wall sample is kept.
    assert cost.observe(708, 900.0, "unrolled", graph="g2", op_class="dot+while", cpu_ms=1.0)
    assert cost.estimate(708, "unrolled", "g2", "dot+while") == pytest.approx(900.0)
