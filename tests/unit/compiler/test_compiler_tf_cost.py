"""TensorFlow: XLA compiles priced by the size of the graph XLA will compile; the while-loop step
(the new `xla_loop` choice) computes the same loss and gradients as eager."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from _support import lazy_import, needs

from microco.clients.compiler._tf_cost import (
    COLD_MS_PER_INSTRUCTION,
    XlaCostModel,
    hlo_instruction_count,
    step_hlo_instructions,
    unrolled_hlo_instructions,
)
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.clients.compiler.zoo import CELL_NAMES

# TensorFlow and the modules that import it are imported by the first test that uses them, not
# when each xdist worker collects this file (_support.lazy_import).
tf = lazy_import("tensorflow")
_tf = lazy_import("microco.clients.compiler._tf")
zt = lazy_import("microco.clients.compiler.zoo._tf_models")

pytestmark = [pytest.mark.tensorflow, needs("tensorflow")]


def _grads(model, x, y, **choices):
    jit = choices.pop("jit", False)

    def f(x, y):
        with tf.GradientTape() as tape:
            loss = zt.loss_fn(_tf.run_model(model, x, **choices), y)
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = tf.function(f, jit_compile=True)(x, y) if jit else f(x, y)
    return loss.numpy(), [g.numpy() for g in grads]


def _same(a, b, tol=1e-5):
    assert np.allclose(a[0], b[0], atol=tol, rtol=tol)
    assert len(a[1]) == len(b[1])
    for ga, gb in zip(a[1], b[1]):
        assert np.allclose(ga, gb, atol=tol, rtol=1e-4)


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_while_loop_step_matches_eager(cell):
    model = zt.make_model(cell, 5, 7, layers=2)  # two layers: the loop's stacked output feeds the next
    x, y = zt.synthetic_batch(3, 3, 5)
    ref = _grads(model, x, y, hoist=False, batch=False)
    for hoist, batch in itertools.product([False, True], [False, True]):
        _same(ref, _grads(model, x, y, hoist=hoist, batch=batch, loop=True))


def test_xla_while_loop_step_matches_eager():
    model = zt.make_model("lstm", 4, 6)
    x, y = zt.synthetic_batch(3, 2, 4)
    ref = _grads(model, x, y, hoist=False, batch=False)
    _same(ref, _grads(model, x, y, hoist=True, batch=True, loop=True, jit=True), tol=1e-4)


def test_hlo_size_grows_with_the_unrolled_graph_not_with_the_loop():
    x2, y2 = zt.synthetic_batch(2, 2, 4)
    x6, y6 = zt.synthetic_batch(6, 2, 4)

    def size(x, y, loop):
        a = _tf.AstraTF(zt.make_model("gru", 4, 6), tf.keras.optimizers.SGD(0.1), zt.loss_fn, _NoExplorer())
        return step_hlo_instructions(a.variant(False, False, True, loop=loop), x, y)

    unrolled2, unrolled6 = size(x2, y2, False), size(x6, y6, False)
    assert 0 < unrolled2 < unrolled6  # one cell copy per time step
    a = _tf.AstraTF(zt.make_model("gru", 4, 6), tf.keras.optimizers.SGD(0.1), zt.loss_fn, _NoExplorer())
    assert unrolled_hlo_instructions(a.variant(False, False, True), x6, y6) == unrolled6  # linear in T
    assert size(x2, y2, True) == size(x6, y6, True)  # one loop body, whatever the sequence length
    assert (
        hlo_instruction_count(
            "HloModule m\n\nENTRY %e (p: f32[]) -> f32[] {\n  %p = f32[] parameter(0)\n"
            "  ROOT %n = f32[] negate(f32[] %p)\n}\n"
        )
        == 2
    )


def test_cost_model_calibrates_and_persists(tmp_path):
    path = tmp_path / "rate.json"
    cold = XlaCostModel("cpu-a", path)
    assert cold.rate() == COLD_MS_PER_INSTRUCTION
    assert cold.estimate(2_000) > cold.estimate(1_000)  # a bigger graph costs more
    assert cold.observe(1_000, 500.0)  # measured: 0.5 ms per instruction on this hardware
    assert cold.rate() == pytest.approx(0.5)
    assert cold.rate("unrolled") == COLD_MS_PER_INSTRUCTION  # another kind of module: its own rate
    assert cold.observe(1_000, 9_000.0, "unrolled")
    assert cold.rate("unrolled") == pytest.approx(9.0) and cold.rate() == pytest.approx(0.5)
    assert not cold.observe(1_000, 10**9)  # a stalled step is not a rate
    assert not cold.observe(0, 100.0)
    again = XlaCostModel("cpu-a", path)  # the next job on this hardware starts from the measured rate
    assert again.rate() == pytest.approx(0.5)
    assert again.estimate(2_000) == pytest.approx(1_000.0)
    assert again.estimate(2_000, "unrolled") == pytest.approx(18_000.0)
    assert XlaCostModel("cpu-b", path).rate() == COLD_MS_PER_INSTRUCTION  # other hardware: cold
    assert json.loads(path.read_text())["cpu-a"]["ms_per_instruction_alone"]["loop"] == [0.5]
    (tmp_path / "bad.json").write_text("{not json")
    assert XlaCostModel("cpu-a", tmp_path / "bad.json").rate() == COLD_MS_PER_INSTRUCTION


def _tiny_astra(cell, cost, total_steps):
    return _tf.AstraTF(
        zt.make_model(cell, 4, 6),
        tf.keras.optimizers.SGD(0.05),
        zt.loss_fn,
        LocalExplorer(policy=ExplorationPolicy(measure_steps=1)),
        total_steps=total_steps,
        cost_model=cost,
        background=False,  # compiles in line: the trials' own steps measure them (the pricing tested here)
    )


def test_module_sizes_are_counted_once_per_model_and_host(tmp_path, monkeypatch):
    """The first run counts its XLA modules' HLO sizes (traces); the next run of the same model
    and shapes on this host reads them back and traces nothing for pricing; another shape counts."""
    import microco.clients.compiler._tf as tf_mod

    counted = []
    real = tf_mod.step_hlo_profile

    def counting(fn, x, y):
        counted.append(int(x.shape[0]))
        return real(fn, x, y)

    def unrolled(fn, x, y):
        n, cls = counting(fn, x, y)
        return 5 * n, cls

    monkeypatch.setattr(tf_mod, "step_hlo_profile", counting)
    monkeypatch.setattr(tf_mod, "unrolled_hlo_profile", unrolled)
    path = tmp_path / "rate.json"

    def first_step(seq):
        x, y = zt.synthetic_batch(seq, 2, 4)
        astra = _tiny_astra("gru", XlaCostModel("hw", path), total_steps=100)
        astra.step(x, y)
        return astra.hlo_instructions, astra.session.spec.variables

    sizes, variables = first_step(3)
    assert len(counted) == 2 and sizes["loop"] > 0 and sizes["unrolled"] > 0
    again, again_vars = first_step(3)
    assert len(counted) == 2  # nothing traced to price the second run
    assert again == sizes and again_vars == variables  # the same prices
    other, _ = first_step(4)
    assert len(counted) == 4 and other != sizes
    stored = json.loads(path.read_text())["hw"]
    assert len(stored["module_sizes"]) == 2 and "ms_per_instruction_alone" in stored
    # A rate measured later keeps the sizes (and the other way round).
    model = XlaCostModel("hw", path)
    assert model.observe(1_000, 500.0)
    assert len(json.loads(path.read_text())["hw"]["module_sizes"]) == 2


@pytest.mark.parametrize("ms_per_instruction, tried", [(0.05, True), (100.0, False)])
def test_tiny_model_tries_xla_only_when_its_estimated_compile_pays_back(tmp_path, ms_per_instruction, tried):
    """A real tiny model and run: its XLA modules' sizes come from their HLO; at a cheap rate the
    XLA choices are tried (compiled, measured, and the measured compile calibrates the rate); at
    a rate where no compile can pay back within the run, none is tried and nothing compiles."""
    cost = XlaCostModel("hw", tmp_path / "rate.json", cold_rate=ms_per_instruction)
    x, y = zt.synthetic_batch(2, 4, 4)
    astra = _tiny_astra("sru", cost, total_steps=2_000)

    def xla_trials():
        state = astra.session.explorer.core.get(astra.session.spec.key)
        return [t for t in state.trials if any(t.values[k] != "off" for k in ("xla", "xla_loop", "xla_cell"))]

    def calibrated():
        classes = astra.hlo_classes
        return bool(cost.samples("loop", classes["loop"]) or cost.samples("unrolled", classes["unrolled"]))

    losses = [astra.step(x, y)]
    # Stops at the commit, or (cheap rate) once an XLA trial has been compiled and its compile
    # measured: every further XLA trial is another compile (most of this test's time).
    while not astra.committed and len(losses) < 300 and not (tried and xla_trials() and calibrated()):
        losses.append(astra.step(x, y))
    assert (astra.committed or tried) and losses[-1] < losses[0]
    assert astra.hlo_instructions["loop"] > 0 and astra.hlo_instructions["unrolled"] > 0
    state = astra.session.explorer.core.get(astra.session.spec.key)
    assert bool(xla_trials()) is tried
    # measured compiles move the rate of their kind and class (and this graph's own price)
    classes = astra.hlo_classes
    assert (
        bool(cost.samples("loop", classes["loop"]) or cost.samples("unrolled", classes["unrolled"])) is tried
    )
    assert (cost.measured(astra.graph_key, "loop") or cost.measured(astra.graph_key, "unrolled")) is tried
    if not tried:
        assert any("cannot repay" in p for p in state.pruned)


class _NoExplorer:
    def register(self, spec):  # pragma: no cover - never called: no step runs
        raise AssertionError

    def report(self, key, report):  # pragma: no cover
        raise AssertionError


@pytest.mark.parametrize("background, factor", [(True, 1.0), (False, 4.0)])
def test_a_background_xla_compile_is_priced_at_its_work_alone_an_inline_one_at_the_load(
    tmp_path, monkeypatch, background, factor
):
    """keras-sublstm (issue 18): its XLA compile, 2.3 s alone by this host's measurements, was
    priced 2.9-7.1 s at loads 3.5-4 (scaled as if it stopped the training) and pruned, though it
    compiles in the background while the training runs on: there it can take from the training
    at most its own work. In line, it stops the training for its wall time at today's load."""
    from microco.clients.compiler import _compile_costs, _session

    cost = XlaCostModel("hw", tmp_path / "rate.json", cold_rate=1.0)
    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)
    assert cost.observe(1_000, 2_300.0, "unrolled", "g", "dot+while")  # measured alone: 2.3 s
    monkeypatch.setattr(_compile_costs, "contention", lambda: 4.0)  # the machine at load 8 on 2 cores
    # (a core idle beside the training: the compile stays in the background whatever the
    # machine's own load; with no core idle, ``compiles_in_line`` answers from the load)
    monkeypatch.setattr(_session, "idle_cores", lambda: 1.5)
    astra = _gru_astra(cost_model=cost, background=background)
    astra.graph_key, astra.hlo_classes = "g", {"unrolled": "dot+while", "loop": "dot+while"}
    priors = {v.name: v.compile_prior_ms for v in astra.variables({"unrolled": 1_000, "loop": 400})}
    assert priors["xla"] == pytest.approx(2_300.0 * factor)
    assert priors["xla_loop"] == pytest.approx(400.0 * 1.0 * factor)  # the cold rate, scaled alike
    # The deadline of a compile in the background is still on its wall time at the load.
    astra.hlo_instructions = {"unrolled": 1_000}
    assert astra._price_ms("unrolled") == pytest.approx(2_300.0 * 4.0)


def test_an_inline_compile_is_priced_at_its_wall_on_the_cores_it_kept_busy(tmp_path, monkeypatch):
    """keras-sublstm (issue 18, session 34): its XLA compile, in line, took 585 ms of wall for
    977 ms of the process's CPU (XLA compiles on both cores); priced at that CPU time, 1,011 ms,
    against 980 ms of saving at 1,000 steps, it was never tried, where a static XLA run was 15%
    faster than eager. A price in CPU time is the compile's wall on the cores its in-line
    compiles kept busy here; the work alone (a background compile's share) stays its CPU time."""
    import os

    from microco.clients.compiler import _compile_costs

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)
    path = tmp_path / "rate.json"
    cost = XlaCostModel("hw", path, cold_rate=1.0)
    assert cost.parallelism() == 1.0  # nothing measured: CPU time is wall time
    assert cost.observe(1_000, 600.0, "unrolled", "g", "dot+while", cpu_ms=960.0)  # 1.6 cores busy
    assert cost.parallelism() == pytest.approx(1.6)
    assert cost.estimate(1_000, "unrolled", "g", "dot+while") == pytest.approx(600.0)
    assert cost.estimate(1_000, "unrolled", "g", "dot+while", at_load=False) == pytest.approx(960.0)
    assert cost.estimate(2_000, "unrolled", "g2", "dot+while") == pytest.approx(1_200.0)  # the class's rate
    monkeypatch.setattr(_compile_costs, "contention", lambda: 2.0)  # each thread half a core
    assert cost.estimate(1_000, "unrolled", "g", "dot+while") == pytest.approx(1_200.0)
    # a background compile is timed by its wall (over the load): already a wall time
    assert cost.observe(1_000, 1_600.0, "unrolled", "g3", "dot+while")  # 800 ms alone
    assert cost.estimate(1_000, "unrolled", "g3", "dot+while") == pytest.approx(1_600.0)
    assert cost.parallelism() == pytest.approx(1.6)  # (no CPU time: not a sample)
    # kept for the next job on this host
    assert XlaCostModel("hw", path, cold_rate=1.0).parallelism() == pytest.approx(1.6)
    # never below one core nor above the host's cores
    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)
    cost.observe(1_000, 600.0, "unrolled", "g4", "dot+while", cpu_ms=300.0)
    cost.observe(1_000, 100.0, "unrolled", "g5", "dot+while", cpu_ms=900.0)
    assert cost._parallel["xla"][-2:] == [1.0, 4.0]


def test_an_xla_gain_measured_here_replaces_the_optimistic_expectation(tmp_path):
    """keras-sublstm at 1,000 steps (issue 18, 2026-12-03): XLA ran 1.6x its plain step (2.52
    against 1.56 ms of CPU) at 5,000 steps, but a run of 1,000 expected a quarter of its time
    saved (0.63 s), below the compile's price, and stayed plain against a static XLA run 1.13x
    faster. At a commit of an XLA choice its interleaved speedup is kept for the graph on this
    host (as PyTorch's whole-step compiles), and a later run's core expects it."""
    from dataclasses import replace

    from microco.clients.compiler._tf import tf_hardware_id
    from microco.clients.compiler.explore import GraphSpec, TrialReport, Variable, _core

    astra = _gru_astra()
    astra.graph_key = "g"
    assert astra._measured_gain("xla") is None
    # An earlier run committed XLA over the plain step after an interleaved A/B (2.52 vs 1.56 ms).
    xla = Variable("xla", ("off", "on", "plain"), "", 3, compiles=True, compile_prior_ms=1.0)
    spec = GraphSpec("fp", "(16, 16, 32)", "cpu", (xla,), "m", "tensorflow", 100_000)
    explorer = LocalExplorer()
    cfg = explorer.register(spec)
    while not cfg.committed:
        on = cfg.values["xla"] != "off"
        cfg = explorer.report(spec.key, TrialReport(cfg.trial, [50.0] + [1.56 if on else 2.52] * 4))
    assert cfg.values["xla"] != "off"
    astra.session.explorer, astra.session.spec = explorer, spec
    astra._learn_gain()
    gain = astra.compile_costs.gain(tf_hardware_id(), "tf:xla", "g")
    assert gain == pytest.approx(explorer.core.get(spec.key).speedup) and gain > 1.4
    # The next run's variable carries it.
    mine = next(v for v in astra.variables({"unrolled": 708, "loop": 300}) if v.name == "xla")
    assert mine.measured_speedup == pytest.approx(gain)
    # The core: XLA priced 0.8 s against 1,000 steps of 2.52 ms, tried only with the gain.
    priced = replace(mine, compile_prior_ms=800.0)
    state = _core.start(
        GraphSpec("fp", "(16, 16, 32)", "cpu", (priced,), "m", "tensorflow", 1000), _core.ExplorationPolicy()
    )
    state.trials.append(_core.TrialRecord(0, {}, 0, "baseline", steps=[2.52] * 6, step_ms=2.52, done=True))
    state.best = 0
    why = {
        g: _core._prune_reason(
            state, _core.ExplorationPolicy(), "", [replace(priced, measured_speedup=g)], {"xla": "plain"}
        )
        for g in (gain, 0.0)
    }
    assert why[gain] == "" and "cannot repay" in why[0.0]


def test_a_compile_measured_here_runs_in_line_where_no_core_is_idle(tmp_path, monkeypatch):
    """keras-sublstm at 5,000 steps (2026-12-03, load ~4 on 2 cores): its XLA compile ran 1.28 s
    of wall beside the training, the run held 310 steps for it and
    committed after 2.9 s, against the static contender's 1.7 s compile in line (1.06x). Where
    no core is idle and this graph's compile was measured here, the trial compiles in line,
    priced at its wall time at the load; otherwise in the background, at its work alone."""
    from microco.clients.compiler import _compile_costs, _session

    cost = XlaCostModel("hw", tmp_path / "rate.json", cold_rate=1.0)
    astra = _gru_astra(cost_model=cost)
    astra.graph_key, astra.hlo_classes = "g", {"unrolled": "dot+while", "loop": "dot+while"}
    monkeypatch.setattr(_compile_costs, "contention", lambda: 2.0)
    monkeypatch.setattr(_session, "idle_cores", lambda: -1.0)
    assert not astra.compiles_in_line("unrolled")  # never compiled here: the background's deadline
    cost.observe_abandoned("g", "unrolled", 5_000.0)
    assert not astra.compiles_in_line("unrolled")  # abandoned: a floor, not a measure
    assert cost.observe(1_000, 1_300.0, "unrolled", "g", "dot+while", cpu_ms=280.0)
    assert astra.compiles_in_line("unrolled") and not astra.compiles_in_line("loop")
    priors = {v.name: v.compile_prior_ms for v in astra.variables({"unrolled": 1_000, "loop": 400})}
    assert priors["xla"] == pytest.approx(280.0 * 2.0)  # in line: its work at the load
    assert priors["xla_loop"] == pytest.approx(400.0 * 1.0)  # the background's: the rate alone
    monkeypatch.setattr(_session, "idle_cores", lambda: 1.5)  # a core beside the training
    assert not astra.compiles_in_line("unrolled")
    assert astra.variables({"unrolled": 1_000})[-1].compile_prior_ms == pytest.approx(280.0)


def _gru_astra(**kwargs):
    return _tf.AstraTF(
        zt.make_model("gru", 4, 6),
        tf.keras.optimizers.SGD(0.05),
        zt.loss_fn,
        LocalExplorer(),
        total_steps=1_000,
        **kwargs,
    )


@pytest.mark.parametrize(
    "op_class", ["dot+gather+scatter", "dot+while", "convolution+reduce-window", "elementwise"]
)
def test_the_calibration_step_has_the_opcodes_of_the_class_it_calibrates(op_class):
    """Issue 18, session 28: a module of a class never compiled here is priced by a small step
    of that class, compiled once (``calibrate``). The step's XLA module (lowered, not compiled)
    has exactly the class's opcodes, so its rate is the class's."""
    from microco.clients.compiler._tf_cost import calibration_step, hlo_class

    fn, args = calibration_step(op_class)
    text = fn.experimental_get_compiler_ir(*args)(stage="hlo")
    assert hlo_class(text) == op_class
    assert 100 < hlo_instruction_count(text) < 1_000  # small: its compile is cheap


def test_a_calibrated_rate_prices_its_class_until_a_compile_of_the_class_is_measured(tmp_path):
    """The calibration's rate replaces the cold prior for its kind and class only, is kept on
    disk for the next job, and gives way to the class's own measured compiles."""
    path = tmp_path / "rate.json"
    cost = XlaCostModel("hw", path, cold_rate=5.0)
    assert not cost.has_rate("unrolled", "dot+gather+scatter")
    assert cost.observe_calibration(200, 400.0, "unrolled", "dot+gather+scatter", cpu_ms=300.0)
    again = XlaCostModel("hw", path, cold_rate=5.0)
    assert again.has_rate("unrolled", "dot+gather+scatter")
    assert again.estimate(1_000, "unrolled", "g", "dot+gather+scatter") == pytest.approx(
        1_500.0
    )  # 1.5 ms (CPU)
    assert again.estimate(1_000, "unrolled", "g", "dot+while") == pytest.approx(
        5_000.0
    )  # another class: the prior
    assert again.estimate(1_000, "loop", "g", "dot+gather+scatter") == pytest.approx(5_000.0)  # another kind
    assert again.observe(1_000, 900.0, "unrolled", "h", "dot+gather+scatter", cpu_ms=800.0)
    assert again.estimate(1_000, "unrolled", "g", "dot+gather+scatter") == pytest.approx(800.0)  # measured
    assert not again.observe_calibration(200, 1e9, "unrolled", "dot")  # a disturbed timing: no rate


def test_a_class_never_compiled_is_priced_on_the_size_curve_at_the_hosts_speed(tmp_path):
    """Issue 18, session 31: a module of a class this host never compiled nor calibrated was priced
    at the flat cold prior, 5 ms an instruction (keras-sublstm's 708: 3.5 s, where it compiled in
    0.6 s), so XLA was pruned at 5,000 steps. Given this host's speed, it is priced on the curve
    measured on reference graphs (a fixed part and a part per instruction) at that speed; a rate
    measured or calibrated for the class still replaces it, and without a speed the prior stays."""
    from microco.clients.compiler._tf_cost import xla_curve_ms

    cost = XlaCostModel("hw", tmp_path / "rate.json", speed=lambda: 2.0)
    assert cost.estimate(10_000, "unrolled", "g", "dot", at_load=False) == pytest.approx(
        2.0 * xla_curve_ms(10_000)
    )
    assert xla_curve_ms(10_000) < 10_000 * COLD_MS_PER_INSTRUCTION / 2  # a fixed part, a smaller slope
    assert xla_curve_ms(200) > xla_curve_ms(100) > 0
    assert cost.observe_calibration(100, 50.0, "unrolled", "dot", cpu_ms=50.0)  # 0.5 ms an instruction
    assert cost.estimate(10_000, "unrolled", "g", "dot", at_load=False) == pytest.approx(5_000.0)
    assert cost.estimate(10_000, "unrolled", "g", "dot+while", at_load=False) == pytest.approx(
        2.0 * xla_curve_ms(10_000)
    )  # (rates are not borrowed across classes)
    # Convolutions: their compile follows more than their size (held out, MobileNetV3Small: 4x
    # the curve): the cold prior.
    assert cost.estimate(10_000, "unrolled", "g", "convolution+dot", at_load=False) == pytest.approx(
        10_000 * COLD_MS_PER_INSTRUCTION
    )
    plain = XlaCostModel("hw", None)
    assert plain.estimate(10_000, "unrolled", "g", "dot", at_load=False) == 10_000 * COLD_MS_PER_INSTRUCTION


def test_the_least_price_never_measures_the_hosts_speed():
    """The count's gate (``AstraTF._worth_pricing``) prices a module from below, to decide whether
    counting it may pay: on the curve at the speed it is handed (the host's where measured, else
    the reference host's) and never above a rate measured here for the kind; it never runs the
    speed probe (30-80 ms: on keras-sublstm at 1,000 steps it cost 3-6% of the run)."""
    from microco.clients.compiler._tf_cost import xla_curve_ms

    asked = []
    cost = XlaCostModel("hw", None, speed=lambda: asked.append(1) or 1.5)
    assert cost.least_ms(200, "unrolled") == pytest.approx(xla_curve_ms(200))
    assert cost.least_ms(200, "unrolled", 2.0) == pytest.approx(2.0 * xla_curve_ms(200))
    assert not asked
    assert cost.observe_calibration(100, 10.0, "unrolled", "dot", cpu_ms=10.0)  # 0.1 ms an instruction
    assert cost.least_ms(200, "unrolled") == pytest.approx(20.0)
    assert XlaCostModel("hw", None, cold_rate=3.0).least_ms(200, "unrolled") == 600.0


def test_tensorflows_speed_probe_is_measured_once_per_host_and_kept(tmp_path, monkeypatch):
    """``measure_tf_speed`` (a reference step traced a few times, CPU time) gives a positive
    speed; the host's record keeps it under its own kind, and ``AstraTF`` reads it from there
    (the next run measures nothing)."""
    from microco.clients.compiler._compile_costs import SPEED_FLOOR, HostCompileCosts
    from microco.clients.compiler._tf_cost import TF_SPEED_KIND, measure_tf_speed

    got = measure_tf_speed(reps=2)
    assert got >= SPEED_FLOOR
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    calls = []
    assert costs.known_speed("cpu", TF_SPEED_KIND) is None
    assert costs.host_speed("cpu", TF_SPEED_KIND, lambda: calls.append(1) or 3.0) == 3.0
    assert costs.known_speed("cpu", TF_SPEED_KIND) == 3.0
    assert costs.host_speed("cpu", TF_SPEED_KIND, lambda: calls.append(1) or 9.0) == 3.0 and len(calls) == 1
    assert HostCompileCosts(tmp_path / "c.json", host="h1").measurements("cpu", "speed:fx-trace") == []
    astra = _tiny_astra("gru", XlaCostModel("hw", None), total_steps=100)
    import microco.clients.compiler._tf as tf_mod

    monkeypatch.setattr(tf_mod, "measure_tf_speed", lambda: 7.0)
    assert astra._tf_speed() == 7.0
    monkeypatch.setattr(tf_mod, "measure_tf_speed", lambda: 8.0)
    assert astra._tf_speed() == 7.0  # kept in the host's record


def test_the_cost_model_astra_builds_prices_cold_compiles_at_the_hosts_speed(tmp_path, monkeypatch):
    """Where the caller hands no cost model, ``AstraTF`` builds one over the host's file with its
    speed (``_tf_speed``): a class never compiled here is priced on the size curve."""
    monkeypatch.setenv("MICROCO_XLA_COST_FILE", str(tmp_path / "xla.json"))
    astra = _tiny_astra("gru", None, total_steps=100)
    x, y = zt.synthetic_batch(3, 2, 4)
    for _ in range(3):
        astra.step(x, y)
    assert astra.cost_model is not None
    assert astra.cost_model.speed is not None and astra.cost_model.speed == astra._tf_speed
