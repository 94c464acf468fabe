"""The whole-step cache probe: asks Inductor's on-disk caches for the training step's graphs
without compiling. Cold: the graph stays eager and nothing is generated; after a compile of the
same step (as ``torch.compile`` would do it), a hit: the compiled step, loaded, and the same
loss and gradients as eager. Against a real Inductor, in a cache directory of the test's own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from _support import through_probe

from microco.clients.compiler import AstraTorch
from microco.clients.compiler._compile_costs import HostCompileCosts
from microco.clients.compiler._torch_cache import CompiledSteps, WholeStepBackend, warm_signal
from microco.clients.compiler.explore import LocalExplorer
from microco.clients.compiler.zoo import torch_models as zm

pytestmark = pytest.mark.torch


@pytest.fixture
def fresh_inductor_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield tmp_path / "inductor"
    torch._dynamo.reset()
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def compiled_gru_cache(tmp_path_factory):
    """Inductor's caches after ``torch.compile`` of the zoo gru's step, compiled once for the
    module (a cold compile is most of these tests' time); a test copies them into its own cache
    directory where it needs them warm, as an earlier run on the host would have left them."""
    where = tmp_path_factory.mktemp("compiled-gru") / "inductor"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(where))
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        torch._dynamo.reset()
        try:
            x, y = zm.synthetic_batch(2, 2, 4)
            baseline = torch.compile(zm.make_model("gru", 4, 4))
            zm.loss_fn(baseline(x), y).backward()
        finally:
            torch._dynamo.reset()
            torch.set_num_threads(old)
    assert any(where.iterdir())
    return where


def _fill(cache, compiled):
    """What torch.compile of the gru step left in a cache directory, copied into ``cache``."""
    shutil.copytree(compiled, cache, dirs_exist_ok=True)


def _loss_and_grads(model, forward, x, y):
    model.zero_grad()
    loss = zm.loss_fn(forward(x), y)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def _probe(model, x, rewrite=False):
    backend = WholeStepBackend(rewrite)
    backend.cache_only = True
    compiled = torch.compile(type(model).forward.__get__(model), backend=backend, dynamic=False)
    with torch.enable_grad():
        compiled(x)
    backend.cache_only = False
    return backend, compiled


def _first_step(total_steps: int) -> AstraTorch:
    """A fresh wrapper's first step of the zoo gru, told ``total_steps`` (the probe, its asks)."""
    torch._dynamo.reset()
    x, y = zm.synthetic_batch(2, 2, 4)
    model = zm.make_model("gru", 4, 4)
    astra = AstraTorch(model, LocalExplorer(), threads=("1",), total_steps=total_steps, background=False)
    through_probe(astra, lambda: zm.loss_fn(model(x), y).backward())
    astra.restore()
    return astra


def test_probe_is_cold_until_the_step_is_compiled_then_hits_and_matches_eager(
    fresh_inductor_cache, compiled_gru_cache
):
    x, y = zm.synthetic_batch(2, 2, 4)
    model = zm.make_model("gru", 4, 4)
    ref = _loss_and_grads(model, model, x, y)

    cold, _ = _probe(model, x)
    assert cold.available and cold.cold == 1 and cold.hits == 0
    # Nothing was generated: the cache directory holds no compiled graph yet.
    assert not fresh_inductor_cache.exists() or not any(fresh_inductor_cache.iterdir())

    # torch.compile's own compile of the same model filled the caches (the module's fixture).
    _fill(fresh_inductor_cache, compiled_gru_cache)
    torch._dynamo.reset()
    warm, compiled = _probe(model, x)
    assert warm.hits == 1 and warm.cold == 0
    loss, grads = _loss_and_grads(model, compiled, x, y)
    assert loss == pytest.approx(ref[0], rel=1e-4, abs=1e-5)
    for g, r in zip(grads, ref[1]):
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-5)


def test_astra_prices_the_whole_step_by_the_probe_and_keys_ignore_priors(
    fresh_inductor_cache, compiled_gru_cache
):
    """A run long enough to repay a warm compile asks the cache: cold keeps the cold prior; a hit
    (after torch.compile filled the cache) prices the whole-step compile at what the probe
    measured, keeps the loaded compile for the trial, and leaves the exploration key unchanged."""
    x, y = zm.synthetic_batch(2, 2, 4)

    def first_step(model):
        astra = AstraTorch(model, LocalExplorer(), threads=("1",), total_steps=10**7, background=False)
        through_probe(astra, lambda: zm.loss_fn(model(x), y).backward())
        return astra, next(v for v in astra.spec().variables if v.name == "model.compile")

    # This host's compile speed, pinned (measured, it moves with the machine's load): a slow
    # host's, so that a cold compile of even this small step is priced far above a load, as the
    # flat prior was (a CI run at load ~7 priced the hit's load at 9.9 s, the step's slowdown 3.3,
    # and this step cold at 4.9 s at the reference speed)
    from microco.clients.compiler import _compile_costs
    from microco.clients.compiler._torch import hardware_id

    HostCompileCosts().record(hardware_id(), _compile_costs.SPEED_KIND, 20.0)
    cold_astra, cold_var = first_step(zm.make_model("gru", 4, 4))
    assert cold_astra.whole_cache["plain"] == "cold"
    assert cold_var.prior_calibrated  # the first price of a graph never compiled here, used as given
    # nothing measured on this host: the step's ATen ops (counted in the probe step) on the op
    # curve at this host's speed, at this process's measured slowdown (issue 18, session 38;
    # session 30: the FX nodes the ask traced; before, the flat 60 s prior)
    assert cold_astra._whole_nodes["plain"] > 0
    ops = cold_astra._step_ops
    assert ops > 0
    assert cold_var.compile_prior_ms == pytest.approx(
        cold_astra.compile_costs.op_prior(cold_astra._hw, ops, slowdown=cold_astra._slowdown)
    )
    # What each ask cost is kept on this host: the next run's gate prices its ask by them.
    asks = cold_astra.compile_costs.measurements(cold_astra._hw, AstraTorch.PROBE_KIND)
    assert len(asks) == len(cold_astra.whole_probe_ms) >= 1
    assert all(r["step"] > 0 for r in asks)  # with the eager step they traced: another graph's price
    assert cold_astra._probe_price_ms() != AstraTorch.WHOLE_WARM_PRIOR_MS
    cold_astra.restore()

    _fill(fresh_inductor_cache, compiled_gru_cache)  # as torch.compile of the same step leaves it
    torch._dynamo.reset()

    model = zm.make_model("gru", 4, 4)
    astra, var = first_step(model)
    assert astra.whole_cache["plain"] == "hit" and var.prior_calibrated
    # A load, priced as one (session 11: the lookup alone was far below what the trial then
    # cost), and the ask already paid is not priced again (issue 18, 2026-12-03: a sunk ask in
    # the price pruned hf-t5's hit): the warm load's prior while no load of this graph was
    # measured here, beyond the lookup the probe ran.
    probe = astra.whole_probe_ms["plain"]
    assert probe > 0
    # (a load alone, at the probe step's own measured slowdown: session 26)
    assert var.compile_prior_ms == pytest.approx(
        max(1.0, AstraTorch.WHOLE_WARM_PRIOR_MS * astra._step_slowdown)
    )
    assert var.compile_prior_ms < cold_var.compile_prior_ms
    assert astra.spec().key == cold_astra.spec().key  # priors are not part of the key
    astra._set_whole_compile("plain")  # the trial: the probe's loaded compile, nothing rebuilt
    assert not astra._needs_compile({"model.compile": "inductor"})
    model2 = zm.make_model("gru", 4, 4)
    model2.load_state_dict(model.state_dict())
    want = _loss_and_grads(model2, model2, x, y)
    got = _loss_and_grads(model, model, x, y)
    assert got[0] == pytest.approx(want[0], rel=1e-4, abs=1e-5)
    for g, w in zip(got[1], want[1]):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-5)
    astra.restore()


def test_the_rewritten_whole_step_is_found_in_the_caches_once_compiled(fresh_inductor_cache):
    """The graph passes' output is cacheable like dynamo's own graph (a method call in it made
    AOTAutograd's cache refuse it, so a run that had compiled it before still priced it cold)."""
    x, y = zm.synthetic_batch(2, 2, 4)
    model = zm.make_model("gru", 4, 4)
    ref = _loss_and_grads(model, model, x, y)
    cold, _ = _probe(model, x, rewrite=True)
    assert cold.cold == 1 and cold.hits == 0 and cold.rewrites > 0
    torch._dynamo.reset()
    compiled = torch.compile(
        type(model).forward.__get__(model), backend=WholeStepBackend(True), dynamic=False
    )
    zm.loss_fn(compiled(x), y).backward()
    torch._dynamo.reset()
    warm, compiled = _probe(model, x, rewrite=True)
    assert warm.hits == 1 and warm.cold == 0
    loss, grads = _loss_and_grads(model, compiled, x, y)
    assert loss == pytest.approx(ref[0], rel=1e-4, abs=1e-5)
    for g, r in zip(grads, ref[1]):
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-5)


def test_the_rewrite_is_not_asked_for_once_the_plain_step_hits_and_a_cold_rewrite_cannot_pay(
    fresh_inductor_cache, compiled_gru_cache, monkeypatch
):
    """hf-t5 at 5,000 steps (issue 18): the plain step was in the caches (a hit), then the
    rewritten step's ask (5.3 s) answered cold and its cold price was pruned at once. With the
    plain step a hit and a run too short to repay a cold rewrite, the rewrite is not asked for;
    in a run long enough to repay it, it still is. (The ask gate is opened: the host's ask price
    is not what this test is about.)"""
    monkeypatch.setattr(AstraTorch, "_probe_price_ms", lambda self: 0.0)
    _fill(fresh_inductor_cache, compiled_gru_cache)
    # 1,000 steps of the tiny gru: its eager time is a fraction of the 60 s cold prior.
    short = _first_step(1000)
    assert short.whole_cache == {"plain": "hit"} and "rewrite" not in short.whole_probe_ms
    long = _first_step(10**9)
    assert long.whole_cache["plain"] == "hit" and long.whole_cache["rewrite"] == "cold"


# -- a cache warmed by another program (issue 18, session of 2026-12-03 morning): a plain
# ``torch.compile`` of a model, run in a process of its own, leaves Inductor's caches holding the
# model's whole step; microco, with a fresh record that never asked for that graph and a run whose
# ask budget (5% of its eager time) cannot pay a trace, reads the caches without a trace, finds the
# compile, asks, and loads it. With an empty cache, or a compile of another graph, it does not ask.

# Another program: the user's own script, ``torch.compile`` of the zoo gru's training step at one
# intra-op thread, as the benchmarks run.
_OTHER_PROGRAM = textwrap.dedent(
    """
    import torch
    from microco.clients.compiler.zoo import torch_models as zm
    torch.set_num_threads(1)
    x, y = zm.synthetic_batch(2, 2, 4)
    model = zm.make_model("gru", 4, 4)
    zm.loss_fn(torch.compile(model)(x), y).backward()
    """
)


@pytest.fixture(scope="module")
def compiled_by_another_program(tmp_path_factory):
    where = tmp_path_factory.mktemp("another-program") / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(where)}
    subprocess.run([sys.executable, "-c", _OTHER_PROGRAM], env=env, check=True, timeout=900)
    assert (where / "aotautograd").is_dir()
    return where


def test_the_caches_show_the_compiled_step_without_a_trace(
    compiled_by_another_program, fresh_inductor_cache, tmp_path
):
    """The model compiled elsewhere is recognised; a model of other shapes, or the same one at
    another thread count (another cache key), or an empty cache, is not."""
    x, _ = zm.synthetic_batch(2, 2, 4)
    root = compiled_by_another_program
    index = tmp_path / "index.json"
    assert warm_signal(zm.make_model("gru", 4, 4), (x,), {}, root=root, index=index)
    assert not warm_signal(zm.make_model("gru", 4, 8), (x,), {}, root=root, index=index)
    assert not warm_signal(zm.make_model("lstm", 4, 4), (x,), {}, root=root, index=index)
    x3, _ = zm.synthetic_batch(3, 2, 4)  # another batch: another graph
    assert not warm_signal(zm.make_model("gru", 4, 4), (x3,), {}, root=root, index=index)
    assert not warm_signal(zm.make_model("gru", 4, 4), (x,), {}, root=fresh_inductor_cache, index=index)
    torch.set_num_threads(2)
    assert not warm_signal(zm.make_model("gru", 4, 4), (x,), {}, root=root, index=index)
    torch.set_num_threads(1)
    # Each entry is read once: a second scan finds them all in the index.
    steps = CompiledSteps(root, index)
    assert steps.scan() and steps.read == 0
    assert Counter(steps.scan()[0].shapes)["4"] >= 1
    # Read within a budget: none left, nothing read (and no signal), the next scan reads them.
    fresh = CompiledSteps(root, tmp_path / "another-index.json")
    assert fresh.scan(budget_ms=0) == [] and fresh.read == 0 and fresh.truncated
    assert not warm_signal(zm.make_model("gru", 4, 4), (x,), {}, root=root, budget_ms=0)
    assert fresh.scan() and fresh.read >= 1 and not fresh.truncated


def test_a_run_asks_the_caches_another_program_warmed_and_not_an_empty_cache(
    compiled_by_another_program, fresh_inductor_cache, monkeypatch
):
    """The run's ask budget pays no trace (its share closed: as Llama's 5% of 5,000 steps, 1.4 s,
    against asks of 3 s). Before: never asked, whatever the caches held. Now: an empty cache is
    not asked; the cache the other program filled is, the ask hits, and its answer is kept."""
    monkeypatch.setattr(AstraTorch, "CACHE_PROBE_SHARE", 0.0)
    cold = _first_step(10**7)
    assert "plain" not in cold.whole_cache and cold.warm_signal is False

    shutil.copytree(compiled_by_another_program, fresh_inductor_cache, dirs_exist_ok=True)
    warm = _first_step(10**7)
    assert warm.warm_signal is True
    assert warm.whole_cache["plain"] == "hit"
    assert "rewrite" not in warm.whole_cache  # the signal speaks for plain torch.compile's graph only
    costs = HostCompileCosts()
    rows = costs.measurements(warm._hw, f"signal:{AstraTorch.PROBE_KIND}")
    assert [r["right"] for r in rows] == [True]


def test_a_signal_is_weighed_by_how_often_it_was_right_here(
    compiled_by_another_program, fresh_inductor_cache, monkeypatch
):
    """Signals that were wrong here lower the chance the gate weighs the ask by: after enough
    wrong answers the same run does not ask."""
    monkeypatch.setattr(AstraTorch, "CACHE_PROBE_SHARE", 0.0)
    shutil.copytree(compiled_by_another_program, fresh_inductor_cache, dirs_exist_ok=True)
    a = _first_step(10**7)
    assert a.warm_signal is True
    costs = HostCompileCosts()
    p0 = costs.signal_precision(a._hw, AstraTorch.PROBE_KIND, AstraTorch.WARM_SIGNAL_PRIOR)
    for _ in range(20):
        costs.record_signal(a._hw, AstraTorch.PROBE_KIND, False)
    p = costs.signal_precision(a._hw, AstraTorch.PROBE_KIND, AstraTorch.WARM_SIGNAL_PRIOR)
    assert p < p0 / 4
    saving = a._optimistic_saving_ms(10.0)
    monkeypatch.setattr(AstraTorch, "_probe_price_ms", lambda self: 0.5 * saving)
    a._probe_spent_ms = 0.0
    assert not a._worth_cache_probe(10.0)  # p x saving < half the saving
    costs.record_signal(a._hw, AstraTorch.PROBE_KIND, True)
    for _ in range(20):
        costs.record_signal(a._hw, AstraTorch.PROBE_KIND, True)
    assert a._worth_cache_probe(10.0)  # right every time: nearly the whole saving


def _kept_as_a_call(x):
    return x.t()


class _Bypassed(torch.nn.Module):
    """A step whose graph AOTAutograd's cache bypasses: a function dynamo keeps as a call
    (``allow_in_graph``, as einx's are in x-transformers), which that cache does not accept. Its
    graphs are matrix products alone (no kernel to build: the test compiles in about a second)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 6, bias=False)

    def forward(self, x):
        return self.a(_kept_as_a_call(x))


def test_a_step_aotautograds_cache_bypasses_is_read_and_asked_from_the_fx_graph_cache(
    fresh_inductor_cache, tmp_path
):
    """Before: the read went through AOTAutograd's entries alone and answered "surely never
    compiled here" (``read_signal``: (False, True)), and the ask refused the bypass as a miss
    (cold), though torch.compile had left both graphs in the FX graph cache and loaded them.
    Now: the signal, and the ask hits, forward and backward, with eager's gradients."""
    from torch._dynamo.utils import counters

    from microco.clients.compiler._torch_cache import read_signal

    torch._dynamo.allow_in_graph(_kept_as_a_call)
    torch.manual_seed(0)
    model, x, grad = _Bypassed(), torch.randn(4, 3), torch.randn(3, 6)
    ref = model(x)
    ref.backward(grad)
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    bypassed = counters["aot_autograd"]["autograd_cache_bypass"]
    torch.compile(model)(x).backward(grad)  # the user's torch.compile fills the caches
    assert counters["aot_autograd"]["autograd_cache_bypass"] > bypassed
    assert not (fresh_inductor_cache / "aotautograd").exists()  # nothing there to read
    model.zero_grad()

    index = tmp_path / "index.json"
    assert read_signal(model, (x,), {}, root=fresh_inductor_cache, index=index) == (True, False)

    torch._dynamo.reset()
    backend = WholeStepBackend()
    backend.cache_only = True
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.enable_grad():
        loss = compiled(x)
    assert backend.hits == 1 and backend.cold == 0
    loss.backward(grad)
    assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6)
    for g, r in zip([p.grad for p in model.parameters()], ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-6)


class _Drops(torch.nn.Module):
    """A step that draws random numbers (dropout while training): microco compiles it under
    Inductor's ``fallback_random`` (``_rng``), a plain ``torch.compile`` with Inductor's own
    random stream, two cache keys."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop = torch.nn.Linear(4, 6), torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.a(x)))


def _ask(model, x):
    """microco's cache-only ask of ``model``'s step: the backend after it."""
    torch._dynamo.reset()
    backend = WholeStepBackend()
    backend.cache_only = True
    with torch.enable_grad():
        torch.compile(model, backend=backend, dynamic=False)(x).sum().backward()
    return backend


def test_a_plain_compile_of_a_step_that_draws_is_not_read_as_microcos(fresh_inductor_cache, tmp_path):
    """Before: the read took a plain ``torch.compile``'s entry of a step with dropout for the
    compile microco would load (``read_signal``: (True, False)), and the run asked, in 5.6 s for
    GPT-2 at its default dropout, to be answered cold (its key has ``fallback_random``). Now that
    entry does not signal; the one microco's own compile leaves does, and the ask then hits."""
    from microco.clients.compiler._torch_cache import read_signal

    torch.manual_seed(0)
    model, x = _Drops(), torch.randn(3, 4)
    torch.compile(model)(x).sum().backward()  # the user's torch.compile fills the caches
    index = tmp_path / "index.json"
    assert read_signal(model, (x,), {}, root=fresh_inductor_cache, index=index) == (False, False)
    assert _ask(model, x).cold >= 1  # (what the signal would have promised: not there)

    torch._dynamo.reset()
    torch.compile(model, backend=WholeStepBackend(), dynamic=False)(x).sum().backward()  # microco's compile
    assert read_signal(model, (x,), {}, root=fresh_inductor_cache, index=index) == (True, False)
    asked = _ask(model, x)
    assert asked.hits == 1 and asked.cold == 0
