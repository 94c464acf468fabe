"""Issue 18: compile costs are learned on the host, by kind, from the compiles run there."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _support import through_probe

from microco.clients.compiler import _compile_costs
from microco.clients.compiler._compile_costs import KEEP, HostCompileCosts


class _Null:
    """An explorer that hands out the baseline and ignores reports."""

    def register(self, spec):
        from microco.clients.compiler import baseline

        return baseline(spec)

    def report(self, key, rep):
        return None


def test_the_estimate_follows_the_recorded_measurements(tmp_path):
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    assert costs.estimate("cpu", "torch:whole:plain") is None  # nothing measured: the caller's prior
    for ms in (40_000.0, 90_000.0, 60_000.0):
        costs.record("cpu", "torch:whole:plain", ms)
    assert costs.estimate("cpu", "torch:whole:plain") == 60_000.0  # the median
    # Newer measurements move it (a warm cache shows in every later compile of the kind).
    for _ in range(4):
        costs.record("cpu", "torch:whole:plain", 5_000.0)
    assert costs.estimate("cpu", "torch:whole:plain") == 5_000.0
    # Only the last KEEP are kept.
    for _ in range(KEEP + 5):
        costs.record("cpu", "torch:whole:plain", 7_000.0)
    assert len(costs.measurements("cpu", "torch:whole:plain")) == KEEP
    assert costs.estimate("cpu", "torch:whole:plain") == 7_000.0


def test_per_kind_per_host_scaled_by_graph_size_and_persisted(tmp_path):
    path = tmp_path / "c.json"
    costs = HostCompileCosts(path, host="h1")
    costs.record("cpu", "torch:region:inductor", 3_000.0, size=30)
    costs.record("cpu", "torch:region:inductor", 5_000.0, size=50)
    # 100 ms per node measured: a graph of 80 nodes is priced at 8 s.
    assert costs.estimate("cpu", "torch:region:inductor", size=80) == pytest.approx(8_000.0)
    assert costs.estimate("cpu", "torch:whole:rewrite") is None  # another kind
    assert HostCompileCosts(path, host="h2").estimate("cpu", "torch:region:inductor") is None  # another host
    assert HostCompileCosts(path, host="h1").estimate(
        "cpu", "torch:region:inductor", size=80
    ) == pytest.approx(8_000.0)  # read back from the file


def test_a_corrupt_record_is_an_empty_one(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{not json")
    costs = HostCompileCosts(path, host="h1")
    assert costs.estimate("cpu", "torch:whole:plain") is None
    costs.record("cpu", "torch:whole:plain", 1_000.0)
    assert costs.estimate("cpu", "torch:whole:plain") == 1_000.0


def test_the_wrapper_prices_a_whole_step_compile_by_what_this_host_measured(tmp_path, deep_probe):
    """By this graph's own cold compiles on this host (session 11): not another graph's (a rate
    learned on recurrent cells priced a CNN's compile that then took minutes), not a load."""
    pytest.importorskip("torch")
    from microco.clients.compiler._torch import AstraTorch, hardware_id
    from microco.clients.compiler.zoo import torch_models as zm

    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    costs.record(hardware_id(), "torch:whole:plain", 99_999.0, size=10, graph="another-model")

    def whole_prior():
        model = zm.make_model("gru", 4, 4)
        x, y = zm.synthetic_batch(3, 2, 4)
        # A short run: the cache probe (a dynamo trace) is not worth it, the prior decides alone.
        astra = AstraTorch(
            model, _Null(), threads=("1",), total_steps=2, background=False, compile_costs=costs
        )
        through_probe(astra, lambda: zm.loss_fn(model(x), y).backward())
        whole = next(v for v in astra.spec().variables if v.name == "model.compile")
        region = next(v for v in astra.spec().variables if v.name.endswith(".compile") and v.region)
        assert not region.prior_calibrated  # no region compile measured here: the core's prior
        # Had the cache probe found the step compiled (50 ms to ask): priced as a load of it.
        astra.whole_cache["plain"], astra.whole_probe_ms["plain"] = "hit", 50.0
        hit = next(v for v in astra._variables() if v.name == "model.compile")
        astra.restore()
        return whole, hit, astra._cost_graph(), astra._slowdown, astra._step_slowdown, astra._step_ops

    whole, hit, graph, slowdown, own, ops = whole_prior()
    # (the graph's FX size unknown without the probe, its ATen ops counted in the probe step: the
    # op curve at this host's speed, as given, at this process's measured slowdown, session 38;
    # the flat cold prior before. Another graph's compile kept no op count: no rate by ops.)
    # A run of 2 steps cannot repay it even on the fastest host: priced at that host's speed,
    # this host's not measured for it (session 38).
    assert ops > 0
    assert whole.compile_prior_ms == pytest.approx(
        costs.op_prior(hardware_id(), ops, slowdown=slowdown, speed=_compile_costs.SPEED_FLOOR)
    )
    assert costs.known_speed(hardware_id()) is None
    assert whole.prior_calibrated
    # No load of this graph measured yet: the lookup plus the warm load's prior, not the lookup alone.
    # (a prior alone, at the probe step's own measured slowdown, the footing of the steps the
    # core weighs it against: session 26)
    assert hit.compile_prior_ms == pytest.approx(50.0 + AstraTorch.WHOLE_WARM_PRIOR_MS * own)
    assert hit.prior_calibrated
    costs.record(hardware_id(), "torch:whole:plain", 12_345.0, graph=graph)
    costs.record(hardware_id(), "torch:whole:plain", 300.0, graph=graph, warm=True)  # a cache hit's load
    whole, hit, again, _, _, _ = whole_prior()
    assert again == graph  # the same model and shapes: the same graph
    assert whole.compile_prior_ms == 12_345.0 and whole.prior_calibrated
    assert hit.compile_prior_ms == 300.0  # a hit: what loading this graph cost here


def test_cold_and_warm_compiles_of_a_graph_are_priced_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    costs.record("cpu", "torch:whole:plain", 200_000.0, size=100, graph="vit")
    costs.record("cpu", "torch:whole:plain", 9_000.0, size=100, graph="vit", warm=True)
    costs.record("cpu", "torch:whole:plain", 11_000.0, size=100, graph="vit", warm=True)
    assert costs.estimate("cpu", "torch:whole:plain", 100, graph="vit") == 200_000.0
    assert costs.estimate("cpu", "torch:whole:plain", 100, graph="vit", warm=True) == 10_000.0
    assert costs.estimate("cpu", "torch:whole:plain", 100, graph="resnet") is None  # not borrowed
    assert costs.estimate("cpu", "torch:whole:plain", 100, graph="resnet", warm=True) is None
    # Callers that name no graph: cold compiles only (a load is not a compile's price).
    assert costs.estimate("cpu", "torch:whole:plain", 100) == 200_000.0


def test_a_price_learned_under_load_is_scaled_to_the_load_now(tmp_path, monkeypatch):
    """Issue 18: XLA's compile measured 35.1 s at load 35 priced it out of a run at load 13-20,
    where it took 10.5 s. A measurement keeps its contention (runnable threads per core); an
    estimate scales it to the contention now. Both cost models, no timing."""
    from microco.clients.compiler import _compile_costs, _tf_cost
    from microco.clients.compiler._tf_cost import XlaCostModel

    load = {"c": 8.0}
    monkeypatch.setattr(_compile_costs, "contention", lambda: load["c"])
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    costs.record("cpu", "torch:whole:plain", 40_000.0, size=400)
    xla = XlaCostModel("cpu", tmp_path / "x.json")
    assert xla.observe(1_000, 8_000.0)  # 8 ms per instruction at contention 8
    assert costs.estimate("cpu", "torch:whole:plain") == pytest.approx(40_000.0)  # same load
    load["c"] = 2.0  # a quarter of the contention: a quarter of the time
    assert costs.estimate("cpu", "torch:whole:plain") == pytest.approx(10_000.0)
    assert costs.estimate("cpu", "torch:whole:plain", size=200) == pytest.approx(5_000.0)
    assert costs.estimate("cpu", "torch:whole:rewrite", size=400) == pytest.approx(
        10_000.0
    )  # other kinds' rate
    assert xla.rate() == pytest.approx(2.0)
    assert XlaCostModel("cpu", tmp_path / "x.json").rate() == pytest.approx(2.0)  # persisted alone
    cold = XlaCostModel("other-cpu", tmp_path / "x.json")
    assert cold.rate() == pytest.approx(2.0 * _tf_cost.COLD_MS_PER_INSTRUCTION)  # the cold prior too


def test_the_first_price_of_an_unseen_graph_is_its_size_on_the_curve_at_the_highest_scale_seen_here(
    tmp_path, monkeypatch
):
    """Issue 18 (hf-t5: a rewritten step never compiled here priced ~19 s, abandoned at its
    57.6 s deadline after 151 s of exploration): a graph with no compile of its own on this host
    is priced by its size on the reference curve (a fixed part and a part per node,
    ``compile_curve_ms``) at the highest scale this host measured for the kind (its family's,
    else), deadline floors included (a lower bound); loads are not compiles. Session 30: the
    scale was per node alone, and a small graph's compile, mostly its fixed part, priced a large
    graph at several times what it took."""
    from microco.clients.compiler._compile_costs import compile_curve_ms as curve

    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    assert costs.first_price("cpu", "torch:whole:rewrite", 1000) is None  # nothing here: the prior
    costs.record("cpu", "torch:whole:plain", 10_000.0, size=500, graph="a")
    costs.record("cpu", "torch:whole:plain", 300.0, size=500, graph="a", warm=True)  # a load
    assert costs.first_price("cpu", "torch:whole:plain", 1000) == pytest.approx(
        10_000.0 / curve(500) * curve(1000)
    )
    costs.record("cpu", "torch:whole:plain", 30_000.0, size=500, graph="b", floor=True)  # at least
    assert costs.first_price("cpu", "torch:whole:plain", 1000) == pytest.approx(
        30_000.0 / curve(500) * curve(1000)
    )
    # A kind never compiled here: its family's highest scale; another family's never.
    costs.record("cpu", "torch:region:inductor", 90_000.0, size=10, graph="cell")
    assert costs.first_price("cpu", "torch:whole:rewrite", 1000) == pytest.approx(
        30_000.0 / curve(500) * curve(1000)
    )
    costs.record("cpu", "torch:whole:rewrite", 5_000.0, size=500, graph="c")  # its own kind first
    assert costs.first_price("cpu", "torch:whole:rewrite", 1000) == pytest.approx(
        5_000.0 / curve(500) * curve(1000)
    )
    assert costs.first_price("cpu", "torch:whole:plain", 0) is None  # size unknown
    # A small graph's compile on the curve itself (16 nodes, 2.6 s) prices a graph of 372 nodes
    # at the curve's 20.4 s, where a rate per node priced it at 60 s (measured: 17.5 s, xt-tied)
    small = HostCompileCosts(tmp_path / "s.json", host="h1")
    small.record("cpu", "torch:whole:plain", curve(16), size=16, graph="mlp")
    assert small.first_price("cpu", "torch:whole:plain", 372) == pytest.approx(curve(372))
    assert curve(372) < 0.4 * curve(16) / 16 * 372


def test_a_graph_never_compiled_on_a_host_that_compiled_nothing_is_priced_by_its_size(tmp_path, monkeypatch):
    """Issue 18, session 30: where this host measured no whole-step compile, a graph of known
    size is priced on the reference curve at the host's speed (measured once, by the CPU time
    of a reference trace, and kept), plus Inductor's first compile in the process where none
    ran yet, at the caller's slowdown; before, a flat 60 s for every graph (so the held-out
    x-transformers, 18 s to compile here, were never tried on a cold host)."""
    from microco.clients.compiler._compile_costs import FIRST_IN_PROCESS_MS, SPEED_KIND
    from microco.clients.compiler._compile_costs import compile_curve_ms as curve

    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    speed = costs.host_speed("cpu")  # measured here, once
    assert speed > 0 and costs.measurements("cpu", SPEED_KIND)[-1]["ms"] == speed
    assert HostCompileCosts(tmp_path / "c.json", host="h1").host_speed("cpu") == speed  # kept
    costs.record("cpu", SPEED_KIND, 2.0)  # a host twice as slow as the reference
    assert costs.size_prior("cpu", 0) is None  # size unknown: the caller's prior
    assert costs.size_prior("cpu", 300, first_in_process=False) == pytest.approx(2.0 * curve(300))
    assert costs.size_prior("cpu", 300, first_in_process=True, slowdown=1.5) == pytest.approx(
        2.0 * 1.5 * (curve(300) + FIRST_IN_PROCESS_MS)
    )
    monkeypatch.setattr(_compile_costs, "_inductor_compiled", False)
    assert costs.size_prior("cpu", 300) == pytest.approx(2.0 * (curve(300) + FIRST_IN_PROCESS_MS))
    _compile_costs.mark_inductor_compiled()  # (monkeypatch restores the module's flag)
    assert costs.size_prior("cpu", 300) == pytest.approx(2.0 * curve(300))
    # once this host measured a whole-step compile, that is its scale
    costs.record("cpu", "torch:whole:plain", 3.0 * curve(100), size=100, graph="a")
    assert costs.first_price("cpu", "torch:whole:plain", 300) == pytest.approx(3.0 * curve(300))


def test_an_unrepayable_first_compile_is_not_tried_whatever_other_compiles_cost(tmp_path):
    """The wrapper sends the first price of an unseen whole-step graph as calibrated: the core
    uses it as given. Before, the 60 s cold prior went uncalibrated and a cheap compile of
    another choice (a cell region's, 2 s against its 8 s prior) scaled it to 15 s, which a
    5,000-step run of 20 ms steps (expected saving 25 s) planned, and then could not repay."""
    pytest.importorskip("torch")
    from microco.clients.compiler._torch import AstraTorch, hardware_id
    from microco.clients.compiler.explore import GraphSpec, _core
    from microco.clients.compiler.zoo import torch_models as zm

    costs = HostCompileCosts(tmp_path / "c.json", host="h1")

    model = zm.make_model("gru", 4, 4)
    x, y = zm.synthetic_batch(3, 2, 4)
    astra = AstraTorch(model, _Null(), threads=("1",), total_steps=2, background=False, compile_costs=costs)
    with astra.step():
        zm.loss_fn(model(x), y).backward()
    astra._whole_nodes["plain"] = 2000  # what the probe's trace counts for a large graph
    astra._step_ops = 0  # (its ops not counted: priced by its FX size, as before session 38)
    whole = next(v for v in astra._variables() if v.name == "model.compile")
    # (no whole-step compile measured here: its size at this host's speed, session 30)
    assert whole.compile_prior_ms == pytest.approx(
        costs.size_prior(hardware_id(), 2000, slowdown=astra._slowdown)
    )
    assert whole.prior_calibrated
    costs.record(hardware_id(), "torch:whole:plain", 20_000.0, size=1000, graph="another-model")
    whole = next(v for v in astra._variables() if v.name == "model.compile")
    region = next(v for v in astra._variables() if v.name.endswith(".compile") and v.region)
    astra.restore()
    price = 20_000.0 / _compile_costs.compile_curve_ms(1000) * _compile_costs.compile_curve_ms(2000)
    assert whole.compile_prior_ms == pytest.approx(price) and whole.prior_calibrated
    # (the saving at the core's fixed bound, as the arithmetic below has it: the probe step's
    # profiled estimate, ``expected_speedup``, moves with the machine's load; session 29 saw it
    # plan the compile at load 11)
    whole = replace(whole, expected_speedup=0.0)
    spec = GraphSpec("fp", "(3, 2, 4)", "cpu", (region, whole), "gru", "torch", 5000)
    state = _core.start(spec, _core.ExplorationPolicy())
    state.compile_costs[f"{region.name}=inductor"] = 2_000.0  # a cheap cell compile measured here
    assert _core.compile_estimate(state, [(whole, "inductor")]) == pytest.approx(price)
    state.trials.append(_core.TrialRecord(0, {}, 0, "baseline", steps=[20.0] * 6, step_ms=20.0, done=True))
    state.best = 0
    reason = _core._prune_reason(state, _core.ExplorationPolicy(), "", [whole], {whole.name: "inductor"})
    assert "cannot repay" in reason  # 39 s > 20 ms x 5,000 x 0.5 x 0.5 = 25 s


def test_a_load_beyond_its_ask_is_learned_across_graphs_per_node_at_the_load_now(tmp_path, monkeypatch):
    """Issue 18, session 22: what loading a compile an ask found cost beyond that ask, learned
    from this host's loads of any graph: each load less its ask (kept with it; an older row's
    paired with its graph's ask just before it), per node where sizes are known, at today's
    load, persisted; None where nothing was loaded here (the caller's prior)."""
    load = {"c": 1.0}
    monkeypatch.setattr(_compile_costs, "contention", lambda: load["c"])
    path = tmp_path / "c.json"
    costs = HostCompileCosts(path, host="h1")
    assert costs.warm_load("cpu", "torch:whole:plain", "probe:torch:whole") is None
    costs.record("cpu", "torch:whole:plain", 9_000.0, size=100, graph="a")  # a compile: not a load
    costs.record("cpu", "torch:whole:plain", 4_000.0, size=100, graph="a", warm=True, ask=0.0)  # nor one
    assert costs.warm_load("cpu", "torch:whole:plain", "probe:torch:whole") is None  # no ask found it
    costs.record("cpu", "torch:whole:plain", 1_600.0, size=100, graph="a", warm=True, ask=600.0)
    costs.record("cpu", "probe:torch:whole", 800.0, size=300, graph="b")  # an older row's ask ...
    costs.record("cpu", "torch:whole:plain", 3_800.0, size=300, graph="b", warm=True)  # ... and its load
    assert costs.warm_load("cpu", "torch:whole:plain", "probe:torch:whole") == pytest.approx(2_000.0)
    # 10 ms a node beyond the ask: a graph of 50 nodes is priced at 0.5 s
    assert costs.warm_load("cpu", "torch:whole:plain", "probe:torch:whole", 50) == pytest.approx(500.0)
    load["c"] = 2.0
    again = HostCompileCosts(path, host="h1")  # read back from the file, at twice the load
    assert again.warm_load("cpu", "torch:whole:plain", "probe:torch:whole", 50) == pytest.approx(1_000.0)
    assert again.last_size("cpu", "probe:torch:whole", "b") == 300
    assert again.last_size("cpu", "probe:torch:whole", "c") == 0


def test_a_load_is_priced_by_its_cpu_time_at_the_contention_now_and_never_below_what_it_took(
    tmp_path, monkeypatch
):
    """Issue 18, session 24: the contention a row keeps is the 1-minute load average, which lags;
    measured on loads alone, a load's time is its thread's CPU time times the contention it met.
    A load that kept its CPU time is priced at that at today's contention; one that did not (and
    the load beyond an ask, ``warm_load``) is scaled up to a higher contention, never down. A
    compile (not a load) is scaled both ways, as before."""
    load = {"c": 2.0}
    monkeypatch.setattr(_compile_costs, "contention", lambda: load["c"])
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    costs.record("cpu", "torch:whole:plain", 20_000.0, size=100, graph="g")  # a compile at 2.0
    costs.record("cpu", "torch:whole:plain", 1_600.0, size=100, graph="g", warm=True, ask=600.0)
    costs.record("cpu", "torch:whole:plain", 3_000.0, size=100, graph="h", warm=True, cpu=1_400.0)
    load["c"] = 1.0
    assert costs.estimate("cpu", "torch:whole:plain", graph="g") == pytest.approx(10_000.0)
    assert costs.estimate("cpu", "torch:whole:plain", graph="g", warm=True) == pytest.approx(1_600.0)
    assert costs.warm_load("cpu", "torch:whole:plain", "probe:torch:whole") == pytest.approx(1_000.0)
    assert costs.estimate("cpu", "torch:whole:plain", graph="h", warm=True) == pytest.approx(1_400.0)
    load["c"] = 4.0
    assert costs.estimate("cpu", "torch:whole:plain", graph="g", warm=True) == pytest.approx(3_200.0)
    assert costs.estimate("cpu", "torch:whole:plain", graph="h", warm=True) == pytest.approx(5_600.0)
    assert costs.warm_load("cpu", "torch:whole:plain", "probe:torch:whole") == pytest.approx(2_000.0)


def test_the_pinned_contention_reaches_the_torch_wrapper(tmp_path, monkeypatch):
    """The tests pin the machine's contention on ``_compile_costs`` (conftest: 1.0; the scaling
    tests: their own); ``_torch`` imported the function by name, so its probe step's slowdown
    read the real load average whatever a test pinned (session 27). Pinned far above any real
    load, the wrapper's slowdown is that."""
    torch = pytest.importorskip("torch")
    from microco.clients.compiler._torch import AstraTorch

    monkeypatch.setattr(_compile_costs, "contention", lambda: 1000.0)
    model = torch.nn.Linear(3, 2)
    astra = AstraTorch(
        model,
        _Null(),
        threads=("1",),
        total_steps=2,
        background=False,
        compile_costs=HostCompileCosts(tmp_path / "c.json", host="h1"),
    )
    with astra.step():
        model(torch.ones(4, 3)).sum().backward()
    astra.restore()
    assert astra._slowdown == 1000.0


def test_the_hardware_id_runs_no_subprocess_where_proc_cpuinfo_names_the_cpu(monkeypatch):
    """Issue 18, session 31: ``hardware_id`` called ``platform.processor()`` first, which on Linux
    runs ``uname -p`` in a subprocess (~2 ms of a wrapper's first step), then overwrote it with
    /proc/cpuinfo's model name. Where /proc/cpuinfo names one, no subprocess runs; the id is the
    same."""
    import platform
    from pathlib import Path

    from microco.clients.compiler._torch import hardware_id

    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists() or "model name" not in cpuinfo.read_text():
        pytest.skip("no /proc/cpuinfo model name here")
    before = hardware_id()

    def no_subprocess() -> str:
        raise AssertionError("platform.processor() was called")

    monkeypatch.setattr(platform, "processor", no_subprocess)
    assert hardware_id() == before
