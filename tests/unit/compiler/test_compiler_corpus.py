"""The public-corpus benchmark's JSON (issue 18's contract) on a tiny model of torch's own code:
every field, the three run lengths, training not stopped, the loss equal to eager's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from microco.benchmarks.compiler_corpus import RUN_LENGTHS, Case, _torch_cases, bench_case

pytestmark = pytest.mark.torch


def test_corpus_case_reports_every_field_and_never_stops():
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.GRU(4, 4, batch_first=True), nn.Linear(4, 3)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    def batch():
        g = torch.Generator().manual_seed(0)
        return torch.randn(2, 3, 4, generator=g), torch.randint(0, 3, (2,), generator=g)

    case = Case("tiny-gru", "torch.nn.GRU", Tiny, batch, lambda m, x, y: nn.functional.cross_entropy(m(x), y))
    old = torch.get_num_threads()
    try:
        m = bench_case(case, run_steps=40, rounds=1, cold_cache=True)
    finally:
        torch.set_num_threads(old)
    for key in ("name", "framework", "eager_ms", "static_ms", "microco_ms", "stopped", "loss_rel_diff"):
        assert key in m
    assert m["name"] == "tiny-gru" and m["framework"] == "torch"
    assert m["inductor_cache"] == "fresh per contender"  # (the static compile's not microco's)
    assert m["stopped"] is False and not m["error"]
    assert m["loss_rel_diff"] < 1e-5  # same weights, same batch, as many steps
    # ... and the floor it is read against: the two eager instances after as many steps (on the
    # CPU one thread's eager code is deterministic: equal)
    assert m["aa_loss_rel_diff"] == 0.0
    assert m["static_loss_rel_diff"] < 1e-4  # torch.compile's too (Inductor's float order alone)
    # ... after as many steps as microco took: the difference moves with the step count
    assert m["loss_steps"]["static"] == m["loss_steps"]["microco"] > 0
    # The A/A control: a second eager instance, interleaved with the rest, against eager.
    aa = m["aa"]
    assert aa["eager_aa_ms"] > 0 and aa["ratio"] > 0 and aa["cpu_ratio"] > 0
    assert set(m["cpu_ms"]) == {"eager", "static", "microco@40", "eager_aa"}
    assert set(m["runs"]) == {str(n) for n in RUN_LENGTHS}
    for r in m["runs"].values():
        cpu = r.pop("by_cpu")  # the same totals, the remaining steps at the CPU-time medians
        measured = r.pop("measured_steps")  # each contender's measured prefix (the rest extrapolated)
        assert set(measured) == {"eager", "static", "microco@40"} and all(v >= 1 for v in measured.values())
        assert set(r) == {"eager_s", "static_s", "microco_s", "explored_for"} and all(
            v > 0 for v in r.values()
        )
        assert set(cpu) == {"eager_s", "static_s", "microco_s"} and all(v > 0 for v in cpu.values())
        assert r["explored_for"] == 40  # one exploration, told 40 steps
    assert 0 < m["explore_steps"] <= 40
    assert m["explored"]["40"]["wrapper_us"] >= 0  # the committed wrapper's own cost per step
    # The exploration's trial records (issue 18): each candidate with its steps and verdict.
    rec = m["explored"]["40"]["trials"]
    verdicts = {c["verdict"] for c in rec["candidates"]}
    assert rec["candidates"][0]["config"] == "baseline" and rec["candidates"][0]["steps"] > 0
    assert "committed" in verdicts and rec["committed"] is not None
    for c in rec["candidates"]:
        assert c["verdict"] and c["reason"] and "interleaved" in c and "compile_s" in c
    assert sum(c["steps"] for c in rec["candidates"]) == rec["explore_steps"]
    assert isinstance(rec["pruned"], list) and "probe" in rec
    # The second run over the same on-disk state starts from the commit: no exploration.
    assert m["rerun"]["committed_at_start"] and m["rerun"]["explore_steps"] == 0


def test_each_contender_draws_its_own_random_numbers_as_in_a_run_alone():
    """A model that draws (a dropout) gets the same masks in every contender, as each would alone:
    the contenders, stepped in turns, shared the global generator, so two eager instances of a
    model with drop-path ended 4.6e-4 apart (held-out ConvNeXt, session 36) and the comparison
    of losses said nothing of whether microco keeps eager's numbers."""
    from torch import nn

    class Dropped(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.drop, self.head = nn.GRU(4, 8, batch_first=True), nn.Dropout(0.3), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.drop(self.rnn(x)[0][:, -1]))

    def batch():
        g = torch.Generator().manual_seed(0)
        return torch.randn(4, 3, 4, generator=g), torch.randint(0, 3, (4,), generator=g)

    case = Case(
        "tiny-gru-dropout",
        "torch.nn.GRU",
        Dropped,
        batch,
        lambda m, x, y: nn.functional.cross_entropy(m(x), y),
    )
    old = torch.get_num_threads()
    try:
        m = bench_case(case, run_steps=40, rounds=1, cold_cache=True)
    finally:
        torch.set_num_threads(old)
    assert m["stopped"] is False and not m["error"]
    assert m["aa_loss_rel_diff"] == 0.0  # two eager instances: the same masks, the same losses
    assert m["loss_rel_diff"] < 1e-5  # microco's steps drew eager's masks too


@pytest.mark.parametrize("quick", [True, False])
def test_every_run_length_is_explored_by_a_run_told_that_length(monkeypatch, quick):
    """keras-sublstm at 1,000 (session 23): ``--quick`` explored 300 and 5,000 and totalled
    1,000 from the run told 300, whose core priced XLA's compile against 300 steps: a figure no
    run of 1,000 steps gives. Every run length, ``--quick`` too, is now a run told that length;
    ``--run-steps N`` alone explores once."""
    import argparse

    from microco.benchmarks import compiler_corpus as cc

    told: list[tuple[int, ...]] = []

    def bench(case, run_steps, rounds, lengths=None, cold_cache=False, device="cpu"):
        told.append(tuple(lengths))
        return {"name": case.name, "microco_ms": None, "stopped": False, "config": {}}

    monkeypatch.setattr(cc, "bench_case", bench)
    case = Case("torch-lstm", "stand-in", lambda: None, lambda: (), lambda m: None)  # a --quick name
    old = torch.get_num_threads()
    try:
        for run_steps, want in ((None, RUN_LENGTHS), (300, (300,))):
            args = argparse.Namespace(threads=1, models=None, quick=quick, run_steps=run_steps, argv=[])
            out = cc.run(args, lambda: [case])
            assert told[-1] == want and out["run_lengths_explored"] == list(want)
    finally:
        torch.set_num_threads(old)


def test_the_process_is_warmed_before_any_contender_is_timed(monkeypatch):
    """keras-sublstm (session 23): the runner's first contender, eager, paid TensorFlow's
    once-per-process work (autograph's conversion of the cell, Keras' first trace): its first step
    0.7-3.9 s against microco's whole exploration, its own trace included, 0.3-1.2 s. A run of
    any contender in its own process pays that once; the runner now pays it before timing any."""
    from microco.benchmarks import compiler_corpus as cc

    order: list[str] = []

    class Built(Exception):
        pass

    def eager(name="eager"):
        order.append(name)
        raise Built

    monkeypatch.setattr(
        cc, "_torch_adapter", lambda case, device: {"warm": lambda: order.append("warm"), "eager": eager}
    )
    case = Case("any", "stand-in", lambda: None, lambda: (), lambda m: None)
    with pytest.raises(Built):
        cc.bench_case(case, run_steps=10, rounds=1)
    assert order == ["warm", "eager"]


def test_the_keras_adapter_warms_tensorflow_on_a_throwaway_instance():
    pytest.importorskip("tensorflow")
    from microco.benchmarks.compiler_corpus import _keras_cases, _tf_adapter

    case = next(c for c in _keras_cases() if c.name == "keras-sublstm")
    adapter = _tf_adapter(case)
    adapter["warm"]()  # the model's step traced and run once, and a one-op XLA compile
    first = adapter["eager"]()  # the contenders are built after it, from the same seed
    again = adapter["eager"]("eager_aa")
    assert [w.numpy().tolist() for w in first.model.weights] == [
        w.numpy().tolist() for w in again.model.weights
    ]


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_the_interleaving_puts_every_contender_after_every_other_equally_often(count):
    """torch-transformer (issue 18, 2026-12-03): the runner rotated one order every round, which
    keeps every contender's predecessor: the first microco instance always ran right after the
    static compiler's steps, and measured the eager code it ran 1.10x eager's own. Now every
    contender runs right after every other equally often, and in every position equally often."""
    from collections import Counter

    from microco.benchmarks.compiler_corpus import _interleaved

    names = [f"c{i}" for i in range(count)]
    seen: list[str] = []
    fns = {k: (lambda k=k: seen.append(k)) for k in names}
    _interleaved(fns, rounds=10, per_round=3)
    blocks = seen[::4]
    assert seen == [b for b in blocks for _ in range(4)]  # blocks of a settling step and 3 timed
    assert len(blocks) % count == 0 and len(blocks) // count >= 10
    rounds = [blocks[i : i + count] for i in range(0, len(blocks), count)]
    assert all(sorted(r) == names for r in rounds)
    after = Counter((a, b) for r in rounds for a, b in zip(r, r[1:]))
    assert set(after) == {(a, b) for a in names for b in names if a != b}
    assert len(set(after.values())) == 1  # each ordered pair equally often
    for pos in range(count):
        assert (
            len(set(Counter(r[pos] for r in rounds).values())) == 1 and len({r[pos] for r in rounds}) == count
        )


def test_the_first_step_after_a_switch_is_not_timed(monkeypatch):
    """The first step of a block pays for the contender before it (torch-transformer: 4-24% more
    CPU right after the static compiler's step, up to 8% after another eager instance), which a run
    of one model never pays: it runs untimed, and the medians are those of the steps after it."""
    from microco.benchmarks import compiler_corpus as cc

    class Clock:  # each step advances both clocks: 10 ms right after a switch, else 1 ms
        now, last = 0.0, ""

        def perf_counter(self):
            return self.now

        process_time = perf_counter

    clock = Clock()
    monkeypatch.setattr(cc, "time", clock)

    def step(name):
        clock.now += 0.010 if clock.last != name else 0.001
        clock.last = name

    ms, cpu = cc._interleaved({k: (lambda k=k: step(k)) for k in ("a", "b", "c")}, rounds=6, per_round=2)
    assert ms == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0}) and cpu == ms


def test_on_an_accelerator_each_block_is_timed_whole_between_barriers(monkeypatch):
    """``--device cuda`` (issue 18: the corpus on a lent GPU): a step's kernels run after the
    call returns, so a step timed alone measures its launches, and a barrier after each step
    would take from every contender the overlap a training loop has. Each block of steps is
    timed from a barrier after its settling step to a barrier after its last step; each of its
    steps counts the block's mean (here: the device's work is done at the barrier)."""
    from microco.benchmarks import compiler_corpus as cc

    class Clock:
        now = 0.0

        def perf_counter(self):
            return self.now

        process_time = perf_counter

    clock = Clock()
    monkeypatch.setattr(cc, "time", clock)
    queued = {"work": 0.0}
    log: list[str] = []

    def step(name, device_s):  # returns at once; the device's work waits for the barrier
        log.append(name)
        clock.now += 0.0001
        queued["work"] += device_s

    def barrier():
        log.append("|")
        clock.now += queued["work"]
        queued["work"] = 0.0

    fns = {"a": lambda: step("a", 0.004), "b": lambda: step("b", 0.002)}
    ms, _ = cc._interleaved(fns, rounds=2, per_round=4, barrier=barrier)
    # a's 4 ms of device work per step, b's 2 ms (+0.1 ms of launching), the settling step's
    # work done at the block's first barrier, not counted
    assert ms["a"] == pytest.approx(4.1) and ms["b"] == pytest.approx(2.1)
    assert log[:7] == ["a", "|", "a", "a", "a", "a", "|"]


def test_torchvision_imports_beside_a_cpu_torch():
    import importlib.util

    from microco.benchmarks.compiler_corpus import (
        SKIPPED,
        TORCHVISION_MODELS,
        _torchvision_cases,
        import_torchvision,
    )

    if importlib.util.find_spec("torchvision") is None:
        # Not importable: its models are reported skipped, with the reason (session 11).
        assert _torchvision_cases() == []
        assert set(TORCHVISION_MODELS) <= set(SKIPPED) and "torchvision" in SKIPPED["tv-resnet18"]
        return
    tv = import_torchvision()
    assert tv.models.resnet18(num_classes=10)(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert {c.name for c in _torchvision_cases()} == set(TORCHVISION_MODELS)


def test_the_corpus_names_public_code():
    names = [c.name for c in _torch_cases()]  # (the transformers cases: an import of seconds)
    assert {"torch-lstm", "torch-gru", "torch-lstmcell-loop", "torch-transformer"} <= set(names)
    assert len(names) == len(set(names))


def test_the_heldout_models_are_cases_of_the_corpus_runner():
    """The held-out check runs through the corpus runner (eager, torch.compile and microco
    interleaved; session of 2026-12-03): its models are that runner's cases, each a public model
    built from a tiny config whose training loss is a finite scalar; a model whose package is
    not installed here is reported skipped with the reason (session 27: x-transformers and
    keras-hub, which CI does not install)."""
    pytest.importorskip("transformers")
    from microco.benchmarks.compiler_corpus import SKIPPED
    from microco.benchmarks.compiler_heldout import MODELS, heldout

    cases = heldout()
    names = [c.name for c in cases]
    assert sorted(names + [m for m in MODELS if m not in names and SKIPPED.get(m)]) == sorted(MODELS)
    for c in cases:
        assert isinstance(c, Case)
        if c.framework != "torch":
            continue  # (a Keras model's build and step: the benchmark's)
        x, y = c.batch()
        loss = c.loss(c.make(), x, y)
        assert loss.dim() == 0 and torch.isfinite(loss)


def test_a_heldout_model_whose_package_is_missing_is_skipped_with_the_reason(monkeypatch):
    """x-transformers, keras-hub and timm are not microco's dependencies: without them their
    models are listed under ``skipped`` with what to install, and the rest of the held-out set
    runs."""
    import sys

    from microco.benchmarks import compiler_heldout as ho
    from microco.benchmarks.compiler_corpus import SKIPPED

    monkeypatch.setitem(sys.modules, "x_transformers", None)  # (None: the import raises ImportError)
    monkeypatch.setitem(sys.modules, "keras_hub", None)
    monkeypatch.setitem(sys.modules, "timm", None)
    for name in ho.XT_MODELS + ho.KHUB_MODELS + ho.TIMM_MODELS:
        monkeypatch.delitem(SKIPPED, name, raising=False)
    assert ho._xt_heldout() == [] and ho._khub_heldout() == [] and ho._timm_heldout() == []
    assert all("pip install x-transformers" in SKIPPED[m] for m in ho.XT_MODELS)
    assert all("pip install keras-hub" in SKIPPED[m] for m in ho.KHUB_MODELS)
    assert all("pip install timm" in SKIPPED[m] for m in ho.TIMM_MODELS)


def test_the_keras_contenders_draw_their_dropout_masks_as_in_a_run_alone():
    """Session 37: the torch contenders were each given a random stream of their own (session
    36); Keras 3's dropout layers need none, since each layer draws from a ``SeedGenerator`` of
    its own, seeded as the model is built (``keras.utils.set_random_seed`` before each): two
    eager instances of a Keras model with ``Dropout(0.3)``, stepped in turns, end equal, and
    microco's steps drew eager's masks."""
    pytest.importorskip("tensorflow")
    import keras
    import tensorflow as tf

    def make():
        return keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(4),
            ]
        )

    def batch():
        g = tf.random.Generator.from_seed(7)
        return g.normal((8, 16)), g.uniform((8,), 0, 4, dtype=tf.int32)

    def ce(out, y):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))

    case = Case("keras-mlp-dropout", "keras.layers.Dropout", make, batch, ce, "tensorflow")
    m = bench_case(case, run_steps=40, rounds=1, cold_cache=True)
    assert m["stopped"] is False and not m["error"]
    assert m["aa_loss_rel_diff"] == 0.0
    assert m["loss_rel_diff"] < 1e-5
