"""Astra on a held-out corpus: ``microco bench compiler --corpus public [--quick] [--json]``.

Models the project did not write, built offline from code and small configurations (no weights
are downloaded): torch's own recurrent and attention modules (``nn.LSTM``, ``nn.GRU``,
``nn.LSTMCell`` called once per time step in ``forward``, ``nn.TransformerEncoder``) and, when
the ``transformers`` package is installed (``pip install microco[corpus]``), Hugging Face GPT-2,
BERT and T5 built from tiny configurations; torchvision's resnet18 and mobilenet_v3_small at
32x32 (``import_torchvision`` explains how it imports beside a CPU torch); Keras' own
``keras.applications.MobileNetV3Small`` (weights=None, 32x32) and a custom Keras RNN cell under
``keras.layers.RNN``, where the static compiler is XLA (``jit_compile=True``).

Per model, in one process and side by side (same initial weights, same batch): eager,
``torch.compile`` (default: Inductor) and microco (:class:`AstraTorch` with the exploration core
in-process, each step through ``astra.run`` so that a failed trial is repeated, not lost).
microco runs once per run length (300, 1,000, 5,000; or ``--run-steps N`` alone), each a first
run on this machine told that length, and explores until it commits; a second run of the first
length over the same on-disk state shows whether it starts tuned (``rerun``). Then all run
interleaved, with an A/A control (``aa``: a second eager instance, built last), in rounds whose
orders put each contender after each other equally often (``balanced_orders``), and the medians
of their step times are reported. ``stopped`` is true
when an exception escaped microco's step (the user's training would have ended);
``loss_rel_diff`` compares microco's loss after its steps with eager's after as many steps,
``static_loss_rel_diff`` the static contender's (Inductor's or XLA's float order alone),
``aa_loss_rel_diff`` the A/A control's (the floor: two runs of the same code).
``runs`` gives each contender's total for runs of 300, 1,000 and 5,000 steps: its measured first
steps (compile, exploration, a warm-up step) plus the remaining steps at its interleaved median.
For TensorFlow, "eager" is the user's step under ``tf.function`` and "static" is XLA.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

RUN_LENGTHS = (300, 1000, 5000)
RNG_SEED = 123  # every torch contender's own random stream starts here (``_torch_adapter``)
AA = "eager_aa"  # the A/A control: a second eager instance, built last (``bench_case``)
# A variable's value that is the model as built (left out of a reported configuration, so that
# ``nothing_to_do`` still means "nothing but a thread count")
AS_BUILT = ("off", "eager", "loop")
# Corpus models not built in this process, with the reason (a missing optional package).
SKIPPED: dict[str, str] = {}
TORCHVISION_MODELS = ("tv-resnet18", "tv-mobilenet-v3-small", "tv-vit-tiny")


@dataclass
class Case:
    """One corpus model: how to build it (seeded) and its training loss on a fixed batch."""

    name: str
    source: str  # whose code it is
    make: Callable[[], Any]  # () -> nn.Module (Keras: a keras.Model), seeded by the caller
    batch: Callable[[], tuple[Any, ...]]  # () -> the step's tensors
    # torch: (model, *batch) -> scalar loss; tensorflow: (model output, labels) -> scalar loss
    loss: Callable[..., Any]
    framework: str = "torch"
    # the training loop's optimiser (torch): "sgd" (plain SGD, lr 0.01: no state) or "adamw"
    # (AdamW, lr 1e-3: two moments a parameter, laid out as the parameter was when made)
    optimizer: str = "sgd"


def _torch_cases() -> list[Case]:
    import torch
    from torch import nn

    T, B, D, H = 16, 16, 32, 64  # steps, batch, input features, hidden

    class RNNHead(nn.Module):
        def __init__(self, rnn: nn.Module) -> None:
            super().__init__()
            self.rnn, self.head = rnn, nn.Linear(H, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    class CellLoop(nn.Module):
        """torch's LSTMCell, called once per time step inside forward (the loop in the model)."""

        def __init__(self) -> None:
            super().__init__()
            self.cell, self.head = nn.LSTMCell(D, H), nn.Linear(H, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x.new_zeros(x.shape[0], H)
            c = x.new_zeros(x.shape[0], H)
            for t in range(x.shape[1]):
                h, c = self.cell(x[:, t], (h, c))
            return self.head(h)

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(H, 4, 128, dropout=0.0, batch_first=True)
            self.proj = nn.Linear(D, H)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(H, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(self.proj(x)).mean(1))

    def seq() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(1)
        return torch.randn(B, T, D, generator=g), torch.randint(0, 10, (B,), generator=g)

    def ce(model: nn.Module, x: Any, y: Any) -> Any:
        return nn.functional.cross_entropy(model(x), y)

    return [
        Case("torch-lstm", "torch.nn.LSTM", lambda: RNNHead(nn.LSTM(D, H, 2, batch_first=True)), seq, ce),
        Case("torch-gru", "torch.nn.GRU", lambda: RNNHead(nn.GRU(D, H, 2, batch_first=True)), seq, ce),
        Case("torch-lstmcell-loop", "torch.nn.LSTMCell", CellLoop, seq, ce),
        Case("torch-transformer", "torch.nn.TransformerEncoder", Encoder, seq, ce),
    ]


HF_VOCAB, HF_BATCH, HF_LEN = 256, 4, 32  # the transformers models' tiny configs and batch


def transformers_or_skip(names: tuple[str, ...]) -> Any:
    """``transformers``, or None with ``names`` reported skipped (the reason in ``SKIPPED``)."""
    try:
        import transformers
    except ImportError as exc:
        why = f"transformers is not importable ({exc}); extra microco[corpus]"
        SKIPPED.update(dict.fromkeys(names, why))
        return None
    return transformers


def hf_ids() -> tuple[Any, ...]:
    """The transformers models' batch: token ids, and a label per sequence (3 classes)."""
    import torch

    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, HF_VOCAB, (HF_BATCH, HF_LEN), generator=g)
    return x, torch.randint(0, 3, (HF_BATCH,), generator=g)


def _hf_cases() -> list[Case]:
    tr = transformers_or_skip(("hf-gpt2", "hf-bert", "hf-t5"))
    if tr is None:
        return []
    V, L, ids = HF_VOCAB, HF_LEN, hf_ids

    def gpt2() -> Any:
        cfg = tr.GPT2Config(
            n_layer=2, n_embd=64, n_head=2, vocab_size=V, n_positions=L,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return tr.GPT2LMHeadModel(cfg)

    def bert() -> Any:
        kw: dict[str, Any] = dict(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
            vocab_size=V, max_position_embeddings=L, num_labels=3,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        cfg = tr.BertConfig(**kw)  # (num_labels is one of the base config's keyword arguments)
        return tr.BertForSequenceClassification(cfg)

    def t5() -> Any:
        kw: dict[str, Any] = dict(
            vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
            dropout_rate=0.0, decoder_start_token_id=0,
        )  # fmt: skip
        cfg = tr.T5Config(**kw)
        return tr.T5ForConditionalGeneration(cfg)

    return [
        Case(
            "hf-gpt2",
            "transformers.GPT2LMHeadModel",
            gpt2,
            ids,
            lambda m, x, y: m(input_ids=x, labels=x).loss,
        ),
        Case(
            "hf-bert",
            "transformers.BertForSequenceClassification",
            bert,
            ids,
            lambda m, x, y: m(input_ids=x, labels=y).loss,
        ),
        Case(
            "hf-t5",
            "transformers.T5ForConditionalGeneration",
            t5,
            ids,
            lambda m, x, y: m(input_ids=x, labels=x).loss,
        ),
    ]


_TORCHVISION_SHIM: list[Any] = []  # keeps the op library below alive


def import_torchvision() -> Any:
    """``import torchvision``, also where its compiled operators cannot load.

    The only torchvision builds on this machine's package index are CUDA builds; beside the CPU
    build of torch their C++ extension fails to load, and ``import torchvision`` then fails at
    registering fake kernels for ``torchvision::nms``/``qnms`` ("operator ... does not exist").
    The models (resnet, mobilenet) use none of those detection operators: declaring the two
    schemas (no kernels: calling them raises) lets the package import, models unchanged."""
    import torch

    try:
        import torchvision

        return torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_SHIM.append(lib)
    import torchvision

    return torchvision


def _torchvision_cases() -> list[Case]:
    try:
        tv = import_torchvision()
    except ImportError as exc:
        # Skipped with the reason (the JSON's ``skipped``): the corpus must say what it did not run.
        why = f"torchvision is not importable ({exc}); install it beside torch (extra microco[corpus])"
        SKIPPED.update(dict.fromkeys(TORCHVISION_MODELS, why))
        return []
    import torch
    from torch import nn

    B, S = 8, 32  # batch, image side (small inputs: CIFAR-sized)

    def images() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(3)
        return torch.randn(B, 3, S, S, generator=g), torch.randint(0, 10, (B,), generator=g)

    def ce(model: nn.Module, x: Any, y: Any) -> Any:
        return nn.functional.cross_entropy(model(x), y)

    return [
        Case(
            "tv-resnet18",
            "torchvision.models.resnet18",
            lambda: tv.models.resnet18(num_classes=10),
            images,
            ce,
        ),
        Case(
            "tv-mobilenet-v3-small",
            "torchvision.models.mobilenet_v3_small",
            lambda: tv.models.mobilenet_v3_small(num_classes=10, dropout=0.0),
            images,
            ce,
        ),
        # ViT-tiny's shape (ViT-Ti/16 has width 192, 3 heads, 12 layers) cut to 2 layers of width
        # 64 at 32x32 with 8x8 patches: 16 tokens and a class token, torchvision's own code.
        Case(
            "tv-vit-tiny",
            "torchvision.models.VisionTransformer",
            lambda: tv.models.VisionTransformer(
                image_size=S,
                patch_size=8,
                num_layers=2,
                num_heads=2,
                hidden_dim=64,
                mlp_dim=128,
                num_classes=10,
            ),  # fmt: skip
            images,
            ce,
        ),
    ]


def _keras_cases() -> list[Case]:
    try:
        import keras
        import tensorflow as tf
    except ImportError as exc:
        why = f"tensorflow/keras is not importable ({exc})"
        SKIPPED.update(dict.fromkeys(("keras-sublstm", "keras-mobilenet-v3-small"), why))
        return []

    T, B, D, H = 16, 16, 32, 64

    @keras.saving.register_keras_serializable(package="microco_corpus")
    class SubLSTMCell(keras.layers.Layer):
        """A subtractive LSTM cell (Costa et al. 2017) in Keras' own RNN-cell API, written here
        from TensorFlow operators: ``keras.layers.RNN`` runs the time loop, not our code."""

        def __init__(self, units: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.units = units
            self.state_size = [units, units]

        def build(self, input_shape: Any) -> None:
            d = input_shape[-1]
            self.w = self.add_weight(shape=(d, 4 * self.units), initializer="glorot_uniform", name="w")
            self.u = self.add_weight(shape=(self.units, 4 * self.units), initializer="orthogonal", name="u")
            self.b = self.add_weight(shape=(4 * self.units,), initializer="zeros", name="b")

        def call(self, inputs: Any, states: Any) -> Any:
            h, c = states
            z = tf.sigmoid(tf.matmul(inputs, self.w) + tf.matmul(h, self.u) + self.b)
            i, f, g, o = tf.split(z, 4, axis=-1)
            c = f * c + g - i
            h = tf.sigmoid(c) - o
            return h, [h, c]

    def rnn() -> Any:
        return keras.Sequential(
            [keras.Input((T, D)), keras.layers.RNN(SubLSTMCell(H)), keras.layers.Dense(10)]
        )

    def mobilenet() -> Any:
        return keras.applications.MobileNetV3Small(
            input_shape=(32, 32, 3), weights=None, classes=10, dropout_rate=0.0,
            classifier_activation=None, include_preprocessing=False,
        )  # fmt: skip

    def seq() -> tuple[Any, ...]:
        g = tf.random.Generator.from_seed(4)
        return g.normal((B, T, D)), g.uniform((B,), 0, 10, dtype=tf.int32)

    def images() -> tuple[Any, ...]:
        g = tf.random.Generator.from_seed(5)
        return g.normal((8, 32, 32, 3)), g.uniform((8,), 0, 10, dtype=tf.int32)

    def ce(out: Any, y: Any) -> Any:
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))

    return [
        Case("keras-sublstm", "keras.layers.RNN (custom cell)", rnn, seq, ce, "tensorflow"),
        Case(
            "keras-mobilenet-v3-small",
            "keras.applications.MobileNetV3Small",
            mobilenet,
            images,
            ce,
            "tensorflow",
        ),
    ]


def corpus() -> list[Case]:
    return _torch_cases() + _torchvision_cases() + _hf_cases() + _keras_cases()


# --quick: a subset that finishes in five minutes on an idle 2-core machine (session 11; the
# previous one took 40 minutes at load 20-28, most of it the CNNs' and the ViT's cold compiles,
# XLA's of MobileNetV3Small alone 460 s): torch's LSTM (dynamo does not trace torch's RNN
# modules, so torch.compile leaves it eager), torch's TransformerEncoder (a whole-step Inductor
# compile of seconds, not minutes) and the custom Keras RNN cell (XLA compiles its while loop
# once). microco explores once per run length, each a run told that length, as in the full
# corpus (:func:`explored_lengths`). The full corpus runs the CNNs, the ViT and the transformers.
QUICK = ("torch-lstm", "torch-transformer", "keras-sublstm")


def explored_lengths(run_steps: int | None) -> tuple[int, ...]:
    """The run lengths microco explores, each a first run told that length: ``--run-steps N``
    alone (one exploration, whose totals serve every length), else all of :data:`RUN_LENGTHS`,
    ``--quick`` included. Until 2026-12-03 (session 23) ``--quick`` explored 300 and 5,000 and
    totalled 1,000 from the run told 300: a figure no 1,000-step run gives, since the core
    prices every compile against the steps it is told remain (keras-sublstm: plain, 1.07x)."""
    return (run_steps,) if run_steps else RUN_LENGTHS


def balanced_orders(names: list[str]) -> list[list[str]]:
    """The rounds' orders of an interleaved comparison: a Williams design, in which every
    contender runs in every position equally often and right after every other contender
    equally often (once each for an even count, twice for an odd one: its rows and their
    mirror images). Until 2026-12-03 the runner rotated one order every round, which keeps each
    contender's predecessor fixed: the first microco instance always ran right after the
    static compiler's steps and paid for whatever they leave behind (torch-transformer: the
    same eager code as eager's, 1.10x by wall and by CPU, the contender after it 0.98x)."""
    n = len(names)
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        if len(first) % 2:
            first, lo = first + [lo], lo + 1
        else:
            first, hi = first + [hi], hi - 1
    rows = [[(v + i) % n for v in first] for i in range(n)]
    if n % 2:
        rows += [r[::-1] for r in rows]
    return [[names[v] for v in r] for r in rows]


def _interleaved(
    fns: dict[str, Callable[[], Any]],
    rounds: int,
    per_round: int,
    settle: int = 1,
    barrier: Callable[[], None] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Interleaved blocks of ``per_round`` steps, the rounds' orders balanced
    (:func:`balanced_orders`; ``rounds`` rounded up to whole designs): the contender that runs
    right after another model's steps pays for what that model left in the caches, and a fixed
    predecessor puts that on one (seen: three contenders running the same eager code measured
    20, 27 and 28 ms under a fixed order; 1.10x under the rotation that kept predecessors).
    Medians per step of wall time and of the process's CPU time (ms): on the shared machine the
    wall time of the same code moves with the load by more than the gaps measured; the CPU
    time moves less (it leaves out the time other processes held the cores).

    Each block first runs ``settle`` untimed steps: the first step after a switch pays for the
    switch (measured on torch-transformer, 2026-12-03: up to 8% more CPU after another
    eager instance, 4-24% after the static compiler's step), which no run of one model pays.

    ``barrier`` (an accelerator's synchronize): each block is timed whole, from a barrier after
    its settling steps to one after its last step, and each of its steps counts the block's
    mean. A step timed alone between barriers would leave out of the contenders' times what a
    training loop overlaps (the host queueing the next step while the device runs this one)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    orders = balanced_orders(list(fns))
    rounds = -(-max(rounds, 1) // len(orders)) * len(orders)
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            fn = fns[name]
            for _ in range(settle):
                fn()
            if barrier is not None:
                barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(per_round):
                    fn()
                barrier()
                times[name] += [(time.perf_counter() - t0) * 1e3 / per_round] * per_round
                cpu[name] += [(time.process_time() - c0) * 1e3 / per_round] * per_round
                continue
            for _ in range(per_round):
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
                cpu[name].append((time.process_time() - c0) * 1e3)
    return (
        {k: statistics.median(v) for k, v in times.items()},
        {k: statistics.median(v) for k, v in cpu.items()},
    )


@dataclass
class _Contender:
    """One way of running the model: its step, what its first steps cost, its model."""

    step: Callable[[], Any]
    first_s: float
    first_steps: int
    model: Any = None


def _micro_run(
    case: Case,
    make_step: Callable[[int, Any, str], tuple[Callable[[], Any], Any]],
    n: int,
    explorer: Any,
    tag: str,
    barrier: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """One microco run told it is ``n`` steps long: its steps until it commits (exploration),
    timed; ``stopped`` when an exception escaped microco's step (the user's training ended)."""
    step, astra = make_step(n, explorer, tag)
    stopped, error, steps = False, "", 0
    t0 = time.perf_counter()
    try:
        while steps < n and (steps < 1 or not astra.committed):
            step()
            steps += 1
    except Exception as exc:  # noqa: BLE001 - what would have ended the user's training
        stopped, error = True, f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    with contextlib.suppress(Exception):  # (a device error is the run's, reported above)
        barrier()
    explore_s = time.perf_counter() - t0
    return {
        "trials": _trials(astra, explorer),
        "step": step,
        "astra": astra,
        "explore_s": explore_s,
        "wrapper_us": _wrapper_cost_us(astra) if not stopped else None,
        "explore_steps": steps,
        "trial_steps": astra.explore_steps,
        "committed": astra.committed,
        "stopped": stopped,
        "error": error,
    }


def _trials(astra: Any, explorer: Any) -> dict[str, Any] | None:
    """The exploration's trial records (``explore.trial_records``: each candidate, its steps, its
    interleaved A/B ratios and sign tests, compile seconds, its verdict and reason) and, for
    PyTorch, what asking Inductor's caches answered and cost (``probe``)."""
    from microco.clients.compiler.explore import trial_records

    spec = astra.spec() if callable(getattr(astra, "spec", None)) else astra.session.spec
    state = explorer.core.get(spec.key) if spec is not None else None
    if state is None:
        return None
    out = trial_records(state, explorer.core.policy)
    answers = getattr(astra, "whole_cache", None)
    if answers is not None:
        out["probe"] = {
            kind: {"answer": answer, "s": round(astra.whole_probe_ms.get(kind, 0.0) / 1e3, 3)}
            for kind, answer in answers.items()
        }
    return out


def _wrapper_cost_us(astra: Any, calls: int = 2000) -> float | None:
    """What the wrapper itself costs a step once settled on its commit: CPU microseconds per
    call of a step that does nothing (PyTorch's ``run``; None for a wrapper without one, and
    before the commit is settled, when those calls' times would be reported as the run's)."""
    run = getattr(astra, "run", None)
    if run is None or not astra.session.settled:
        return None

    def nothing() -> None:
        return None

    c0 = time.process_time()
    for _ in range(calls):
        run(nothing)
    return round((time.process_time() - c0) / calls * 1e6, 2)


@contextlib.contextmanager
def _compile_cache(framework: str, directory: str | None) -> Iterator[None]:
    """Inductor's caches in ``directory`` (a fresh one: a first compile on this machine) while a
    contender compiles; None: the user's cache as it is. TensorFlow's XLA keeps no cache on disk."""
    if directory is None or framework != "torch":
        yield
        return
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with temporary_cache_dir(directory):
        yield


def bench_case(
    case: Case,
    run_steps: int,
    rounds: int,
    lengths: tuple[int, ...] | None = None,
    cold_cache: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """Eager, the static compiler and microco side by side on one corpus model.

    microco runs once per run length in ``lengths`` (default ``(run_steps,)``), each a first run
    on this machine (an empty state of its own) told that length, so its exploration is the one
    that length allows; then a second run of the first length over the same state (it should
    start tuned: ``rerun``). The contenders then run interleaved, and each run length's total is
    each contender's measured first steps plus the remaining steps at its interleaved median.

    ``cold_cache``: the static compiler and each microco run told a length compile into Inductor
    caches of their own, fresh (the rerun into its first run's): run in one process against the
    user's cache, a graph the static contender compiled is a cache hit for microco's ask, which a
    model never compiled on this machine would not give it.

    ``device``: where the PyTorch models and their batches live ("cuda": an accelerator; each
    contender's first steps and the interleaved blocks end at a device barrier, see
    :func:`_interleaved`)."""
    import tempfile

    lengths = tuple(lengths or (run_steps,))
    adapter = _torch_adapter(case, device) if case.framework == "torch" else _tf_adapter(case)
    out: dict[str, Any] = {"name": case.name, "framework": case.framework, "source": case.source}
    barrier = adapter.get("barrier")
    out["device"] = adapter.get("device", "cpu")
    # What only the first contender in this process would pay (not a cost of one way of running
    # the model), paid before any contender is timed; its seconds are reported.
    warm = adapter.get("warm")
    if warm is not None:
        t0 = time.perf_counter()
        warm()
        out["process_warmup_s"] = round(time.perf_counter() - t0, 3)
    contenders: dict[str, _Contender] = {"eager": adapter["eager"]()}
    fresh = tempfile.mkdtemp(prefix="microco-corpus-inductor-") if cold_cache else None

    def cache(tag: str) -> Any:
        return _compile_cache(case.framework, os.path.join(fresh, tag) if fresh else None)

    out["inductor_cache"] = "fresh per contender" if fresh else "the user's"
    with cache("static"):
        static, static_error = adapter["static"]()
    if static is not None:
        contenders["static"] = static
    else:
        out["static_error"] = static_error
    explored: dict[int, dict[str, Any]] = {}
    state_dir = tempfile.mkdtemp(prefix="microco-corpus-state-")
    from microco.clients.compiler.explore import LocalExplorer

    explorers: dict[int, Any] = {}
    for n in lengths:
        explorers[n] = LocalExplorer.on_disk(os.path.join(state_dir, f"{case.name}-{n}.json"))
        with cache(f"microco@{n}"):
            explored[n] = _micro_run(
                case, adapter["micro"], n, explorers[n], f"microco@{n}", barrier or (lambda: None)
            )
        if not explored[n]["stopped"]:
            e = explored[n]
            contenders[f"microco@{n}"] = _Contender(e["step"], e["explore_s"], e["explore_steps"])
    # The second run of the first length on this machine: a new wrapper over the same state.
    first = lengths[0]
    rerun: dict[str, Any] = {}
    if not explored[first]["stopped"]:
        with cache(f"microco@{first}"):
            again = _micro_run(
                case, adapter["micro"], first, explorers[first], "rerun", barrier or (lambda: None)
            )
        rerun = {
            "run_steps": first,
            "committed_at_start": bool(again["trial_steps"] == 0 and again["committed"]),
            "explore_steps": again["trial_steps"],
            "first_steps_s": round(again["explore_s"], 3),
            "stopped": again["stopped"],
        }
        adapter["restore"](again["astra"])
    # The A/A control: a second instance of the eager contender, built last (after the static
    # compile and microco's runs, where microco's own instances are built), interleaved like
    # the rest. Its ratio to eager is the runner's own spread between two instances of the
    # same code: a microco figure within it says nothing about microco.
    contenders[AA] = adapter["eager"](AA)
    steps_fns = {k: c.step for k, c in contenders.items()}
    # Steps per timed block: on an accelerator a block is timed whole (its barrier's own cost
    # spread over more steps); on the CPU each step is timed alone.
    per_round = 10 if barrier is not None else 3
    stopped = any(r["stopped"] for r in explored.values())
    error = "; ".join(r["error"] for r in explored.values() if r["error"])
    try:
        for fn in steps_fns.values():
            fn()
        ms, cpu_ms = _interleaved(steps_fns, rounds, per_round, barrier=barrier)
    except Exception as exc:  # noqa: BLE001 - a microco step failing here stopped training too
        stopped, error = True, error + f"; {type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
        steps_fns = {k: f for k, f in steps_fns.items() if not k.startswith("microco")}
        ms, cpu_ms = _interleaved(steps_fns, rounds, per_round, barrier=barrier)
    for k in steps_fns:
        contenders[k].first_steps += 1  # the warm-up step before the interleaving (any state)

    def total(c: _Contender, step_ms: float, n: int) -> float:
        return round(c.first_s + max(0, n - c.first_steps) * step_ms / 1e3, 3)

    # The same totals with the remaining steps at the interleaved median of each step's process
    # CPU time (the first steps as measured, wall): on the shared machine contenders running the
    # same code measured wall medians up to 40% apart (tv-vit-tiny, 2026-12-02: 12.8 against
    # 9.2 ms, CPU 8.2 against 7.9 ms), which a run's 300-step total then carries whole.

    # microco's figure for a run of n steps: the run told n steps, or the nearest explored
    micro_key = {n: f"microco@{min(lengths, key=lambda m: abs(m - n))}" for n in RUN_LENGTHS}
    runs: dict[str, dict[str, Any]] = {}
    for n in RUN_LENGTHS:
        r: dict[str, Any] = {"eager_s": total(contenders["eager"], ms["eager"], n)}
        r["measured_steps"] = {
            c: min(n, contenders[c].first_steps) for c in ("eager", "static", micro_key[n]) if c in ms
        }
        if "static" in ms:
            r["static_s"] = total(contenders["static"], ms["static"], n)
        k = micro_key[n]
        if k in ms:
            r["microco_s"] = total(contenders[k], ms[k], n)
            r["explored_for"] = int(k.split("@")[1])
        r["by_cpu"] = {
            f"{name}_s": total(contenders[c], cpu_ms[c], n)
            for name, c in (("eager", "eager"), ("static", "static"), ("microco", k))
            if c in cpu_ms
        }
        runs[str(n)] = r
    main_k = f"microco@{lengths[-1]}"
    micro_ms = ms.get(main_k)
    last = explored[lengths[-1]]
    astra = last["astra"]
    spec = astra.spec() if callable(getattr(astra, "spec", None)) else astra.session.spec
    state = explorers[lengths[-1]].core.get(spec.key) if spec is not None else None
    loss_rel = static_loss_rel = float("nan")
    loss_steps: dict[str, int] = {}  # the steps after which each loss was compared with eager's
    if not stopped and micro_ms is not None:
        # The static contender's loss against eager's too (issue 18, session 30: xt-tied's
        # compiled step ended 2.4e-2 from eager's, and torch.compile's the same, bit for bit:
        # Inductor's float order, amplified where the loss falls steeply), each after as many
        # steps as eager (``_level``: whichever of the two is behind takes steps). The static
        # contender first takes as many steps as microco took (its exploration included): the
        # difference moves with the step count (xt-tied: 2.2e-2 at 300 steps, 6e-6 at 5,000), and
        # compared at its own, fewer, steps it read 1.2e-7 where microco's read 9.2e-3.
        compared = [k for k in ("static", main_k) if k in steps_fns]
        while "static" in compared and adapter["count"]("static") < adapter["count"](main_k):
            steps_fns["static"]()
        for k in sorted(compared, key=adapter["count"]):
            rel = adapter["loss_rel"](contenders, counts_of=k)
            loss_rel, static_loss_rel = (rel, static_loss_rel) if k == main_k else (loss_rel, rel)
            loss_steps[k] = adapter["count"](k)
    # The same comparison between the two eager instances (the A/A control): how far two runs of
    # the same code end apart here, the floor below which a difference says nothing of microco
    # (on a GPU, nondeterministic kernels: atomics in convolutions' backward, say).
    aa_loss_rel = adapter["loss_rel"](contenders, counts_of=AA) if AA in contenders else float("nan")
    best_base = min(ms["eager"], ms.get("static", float("inf")))
    out.update(
        eager_ms=round(ms["eager"], 3),
        static_ms=round(ms["static"], 3) if "static" in ms else None,
        microco_ms=round(micro_ms, 3) if micro_ms is not None else None,
        microco_ms_by_length={str(n): round(ms[f"microco@{n}"], 3) for n in lengths if f"microco@{n}" in ms},
        cpu_ms={k: round(v, 3) for k, v in cpu_ms.items()},  # per step, interleaved medians
        aa=_aa(ms, cpu_ms),
        static_compile_s=round(contenders["static"].first_s, 3) if "static" in contenders else None,
        explore_steps=last["explore_steps"],
        trial_steps=last["trial_steps"],
        explore_s=round(last["explore_s"], 3),
        explored={
            str(n): {
                "steps": r["explore_steps"],
                "trial_steps": r["trial_steps"],
                "s": round(r["explore_s"], 3),
                "committed": r["committed"],
                "wrapper_us": r["wrapper_us"],  # CPU per step of the committed wrapper, beyond the step
                "config": {k: v for k, v in r["astra"].config.items() if v not in AS_BUILT},
                "trials": r["trials"],
            }
            for n, r in explored.items()
        },
        committed=last["committed"],
        config={k: v for k, v in astra.config.items() if v not in AS_BUILT},
        variables=[v.name for v in spec.variables] if spec is not None else [],
        structure=adapter["structure"](astra),
        interleaved_speedup=round(state.speedup, 3) if state is not None else None,
        speedup_vs_eager=round(ms["eager"] / micro_ms, 3) if micro_ms else None,
        speedup_vs_static=round(ms["static"] / micro_ms, 3) if micro_ms and "static" in ms else None,
        speedup_vs_best_baseline=round(best_base / micro_ms, 3) if micro_ms else None,
        stopped=stopped,
        error=error[:500],
        rolled_back=getattr(astra, "rolled_back", 0),
        loss_rel_diff=loss_rel,
        static_loss_rel_diff=static_loss_rel,
        aa_loss_rel_diff=aa_loss_rel,
        loss_steps={("microco" if k == main_k else k): n for k, n in loss_steps.items()},
        rerun=rerun,
        runs=runs,
    )
    for r in explored.values():
        adapter["restore"](r["astra"])
    adapter["reset"]()
    return out


def _torch_adapter(case: Case, device: str = "cpu") -> dict[str, Any]:
    import torch

    from microco.clients.compiler import AstraTorch

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    # The batch is built on the CPU (the same numbers on every device) and moved.
    batch = tuple(t.to(dev) for t in case.batch())
    torch._dynamo.reset()

    def make() -> tuple[Any, Any]:
        torch.manual_seed(0)  # built on the CPU, as seeded, then moved: the same initial weights
        model = case.make().to(dev)
        model.train()
        if case.optimizer == "adamw":
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def barrier() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def plain(model: Any, opt: Any, fwd: Any = None) -> Callable[[], Any]:
        def step() -> Any:
            loss = case.loss(fwd if fwd is not None else model, *batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return step

    counts: dict[str, int] = {}
    models: dict[str, Any] = {}
    # Each contender draws its random numbers (dropout, drop-path) from a stream of its own,
    # seeded alike, as in a run alone (session 36: the contenders, stepped in turns, shared the
    # global generator, so a model that draws got other masks in each, and two eager instances
    # ended 4.6e-4 apart: the loss comparison said nothing of whether microco keeps eager's
    # numbers). The stream is swapped in around each of its steps (the default generators'
    # states: a few kB copied, the same for every contender).
    streams: dict[str, list[Any]] = {}

    def rng_states() -> list[Any]:
        out = [torch.random.get_rng_state()]
        if dev.type == "cuda":
            out.append(torch.cuda.get_rng_state(dev))
        return out

    def set_rng_states(states: list[Any]) -> None:
        torch.random.set_rng_state(states[0])
        if dev.type == "cuda":
            torch.cuda.set_rng_state(states[1], dev)

    def seeded_states() -> list[Any]:
        saved = rng_states()
        torch.manual_seed(RNG_SEED)
        fresh = rng_states()
        set_rng_states(saved)
        return fresh

    def counted(name: str, model: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
        counts[name], models[name] = 0, model
        streams[name] = seeded_states()

        def step() -> Any:
            counts[name] += 1
            outside = rng_states()
            set_rng_states(streams[name])
            try:
                return fn()
            finally:
                streams[name] = rng_states()
                set_rng_states(outside)

        return step

    def timed_first(fn: Callable[[], Any]) -> float:
        barrier()
        t0 = time.perf_counter()
        fn()
        barrier()
        return time.perf_counter() - t0

    def eager(name: str = "eager") -> _Contender:
        m, o = make()
        fn = counted(name, m, plain(m, o))
        return _Contender(fn, timed_first(fn), 1, m)

    def static() -> tuple[_Contender | None, str]:
        m, o = make()
        try:
            fn = counted("static", m, plain(m, o, torch.compile(m)))
            return _Contender(fn, timed_first(fn), 1, m), ""
        except Exception as exc:  # noqa: BLE001 - the baseline's own failure is reported, not ours
            return None, f"{type(exc).__name__}: {exc}"[:300]

    def micro(n: int, explorer: Any, tag: str) -> tuple[Callable[[], Any], Any]:
        torch._dynamo.reset()
        m, o = make()
        astra = AstraTorch(m, explorer, name=case.name, total_steps=n)
        inner = plain(m, o)
        return counted(tag, m, lambda: astra.run(inner)), astra

    def loss_rel(contenders: dict[str, _Contender], counts_of: str) -> float:
        _level(contenders, counts, counts_of)
        losses = []
        with torch.no_grad():
            for k in ("eager", counts_of):
                outside = rng_states()
                set_rng_states(seeded_states())  # (the same draws in both: a model in training mode)
                try:
                    losses.append(float(case.loss(models[k], *batch)))
                finally:
                    set_rng_states(outside)
        a, b = losses
        return abs(a - b) / max(abs(a), 1e-12)

    def warm() -> None:
        # What the first contender in the process alone would pay, paid before any is timed: on
        # a GPU the CUDA context, cuBLAS and cuDNN handles and the caching allocator's first
        # blocks (session 30, H200: eager, built first, measured 1.97 s for a 300-step run of
        # torch-transformer against microco's 1.67 s running the same eager code), on the CPU
        # oneDNN's first primitives. A throwaway eager instance's step.
        eager("warm-up")

    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "warm": warm,
        "barrier": barrier if dev.type == "cuda" else None,
        "eager": eager,
        "static": static,
        "micro": micro,
        "loss_rel": loss_rel,
        "count": lambda name: counts[name],  # (steps a contender has taken)
        "structure": _structure,
        "restore": lambda astra: astra.restore(),
        "reset": torch._dynamo.reset,
    }


def _tf_adapter(case: Case) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    from microco.clients.compiler import AstraTF
    from microco.clients.compiler.explore import LocalExplorer

    x, y = case.batch()
    counts: dict[str, int] = {}
    models: dict[str, Any] = {}

    def make() -> Any:
        keras.utils.set_random_seed(0)
        return case.make()

    def opt() -> Any:
        return tf.keras.optimizers.SGD(0.01)

    def counted(name: str, model: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
        counts[name], models[name] = 0, model

        def step() -> Any:
            counts[name] += 1
            return fn()

        return step

    def fixed(xla: bool, name: str) -> _Contender:
        # tf.function of the user's step, with or without XLA (``jit_compile=True``)
        m = make()
        # (``traced_step``: the user's step traced under ``jit_compile``, as they would write it;
        # the wrapper's own XLA variant calls its plain step's trace inside the cluster)
        fn = AstraTF(m, opt(), case.loss, LocalExplorer(), xla=True).traced_step(False, False, xla)
        step = counted(name, m, lambda: fn(x, y).numpy())
        t0 = time.perf_counter()
        step()
        return _Contender(step, time.perf_counter() - t0, 1, m)

    def static() -> tuple[_Contender | None, str]:
        try:
            return fixed(True, "static"), ""
        except Exception as exc:  # noqa: BLE001 - XLA's own failure is reported, not ours
            return None, f"{type(exc).__name__}: {exc}"[:300]

    def warm() -> None:
        # TensorFlow's once-per-process work, which the runner's first contender (eager) alone
        # paid, though a run of any contender in its own process pays it (session 23,
        # 2026-12-03, keras-sublstm: eager's first step 0.7-3.9 s against microco's 7 steps,
        # its own trace of the same step included, 0.3-1.2 s; a second instance's trace in one
        # process took 0.54-0.59 s of CPU against the first's 0.78-0.80 s): autograph's
        # conversion of the model's Python code and Keras' first trace, by a throwaway eager
        # instance's step, and XLA's first compile, by a one-op function's.
        fixed(False, "warm-up")
        one = tf.constant([[1.0]])
        tf.function(lambda v: v * 2.0, jit_compile=True)(one).numpy()

    def micro(n: int, explorer: Any, tag: str) -> tuple[Callable[[], Any], Any]:
        m = make()
        astra = AstraTF(m, opt(), case.loss, explorer, name=case.name, total_steps=n)
        return counted(tag, m, lambda: astra.step(x, y)), astra

    def loss_rel(contenders: dict[str, _Contender], counts_of: str) -> float:
        _level(contenders, counts, counts_of)
        a = float(case.loss(models["eager"](x, training=False), y))
        b = float(case.loss(models[counts_of](x, training=False), y))
        return abs(a - b) / max(abs(a), 1e-12)

    return {
        "eager": lambda name="eager": fixed(False, name),
        "static": static,
        "warm": warm,
        "micro": micro,
        "loss_rel": loss_rel,
        "count": lambda name: counts[name],
        "structure": lambda astra: {"structured": astra.structured, "structure": astra.structure},
        "restore": lambda astra: None,
        "reset": lambda: None,
    }


def _level(contenders: dict[str, _Contender], counts: dict[str, int], name: str) -> None:
    """Step eager or ``name``, whichever is behind, until both have run as many steps."""
    for behind, ahead in (("eager", name), (name, "eager")):
        while counts[behind] < counts[ahead]:
            contenders[behind].step()


def _aa(ms: dict[str, float], cpu_ms: dict[str, float]) -> dict[str, float] | None:
    """The A/A control's medians against eager's (ratios above 1: the later instance slower)."""
    if AA not in ms:
        return None
    return {
        "eager_ms": round(ms["eager"], 3),
        "eager_aa_ms": round(ms[AA], 3),
        "ratio": round(ms[AA] / ms["eager"], 3),
        "cpu_ratio": round(cpu_ms[AA] / cpu_ms["eager"], 3),
    }


def _structure(astra: Any) -> dict[str, Any]:
    return {
        "regions": len(astra.runners),
        "whole_step_rewrites": astra.whole_rewrites,
        "whole_cache": dict(astra.whole_cache),
        "whole_failed": dict(astra.whole_failed),
    }


def _best_baseline_s(r: dict[str, Any]) -> float:
    return min(r[k] for k in ("eager_s", "static_s") if k in r)


# How each run length's totals are made (carried in the JSON): no contender runs 5,000 steps here.
TOTALS = (
    "measured first steps (the static compile, microco's exploration to its commit, one warm-up "
    "step; wall) plus the remaining steps of the run at the contender's interleaved median per "
    "step (runs[n]: wall medians; runs[n].by_cpu: process CPU medians); measured_steps gives each "
    "contender's measured prefix"
)


def run(args: Any, cases_of: Callable[[], list[Case]] = corpus, name: str = "public") -> dict[str, Any]:
    """The corpus runner over ``cases_of()`` (default: the public corpus; the held-out models:
    ``compiler_heldout.heldout``), reported under ``corpus: name``."""
    import torch

    torch.set_num_threads(args.threads)
    cases = cases_of()
    names = [c.name for c in cases]
    if args.models:
        wanted = args.models.split(",")
        unknown = [w for w in wanted if w not in names and w not in SKIPPED]
        if unknown:
            raise SystemExit(f"unknown {name} models {unknown}; the {name} corpus: {names}")
        cases = [c for c in cases if c.name in wanted]
    elif args.quick:
        cases = [c for c in cases if c.name in QUICK]
    device = getattr(args, "device", "cpu")
    if device != "cpu":
        # The device runs the PyTorch models; the Keras models' step stays a CPU one here (its
        # accelerator placement is TensorFlow's own, not this runner's): reported skipped.
        for c in cases:
            if c.framework != "torch":
                SKIPPED[c.name] = f"--device {device}: the accelerator table covers the PyTorch models"
        cases = [c for c in cases if c.framework == "torch"]
    if "tensorflow" in sys.modules and any(c.framework == "tensorflow" for c in cases):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    # Each run length explored by a run told that length (issue 18: exploration bounded by the
    # run's remaining steps); --run-steps N: one exploration, used for every length.
    lengths = explored_lengths(args.run_steps)
    run_steps = lengths[0]
    rounds = 10  # --quick too (session 11): at 3 rounds contenders running the same code measured 1.5x apart
    started = time.time()
    models = []
    for case in cases:
        print(f"[bench compiler --corpus] {case.name}", file=sys.stderr, flush=True)
        models.append(
            bench_case(case, run_steps, rounds, lengths, getattr(args, "cold_cache", False), device=device)
        )
        # each model's result as it is done, on stderr: a run cut short keeps what it measured
        print(json.dumps(models[-1], default=float), file=sys.stderr, flush=True)
    ok = [m for m in models if m["microco_ms"] is not None]
    return {
        "benchmark": "compiler",
        "corpus": name,
        "quick": args.quick,
        "totals": TOTALS,
        "command": "microco bench compiler " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_1m": os.getloadavg()[0],
        },
        "threads": args.threads,
        "device": models[0].get("device", device) if models else device,
        "run_lengths_explored": list(lengths),
        "skipped": {k: v for k, v in SKIPPED.items() if not args.models or k in args.models.split(",")},
        "models": models,
        "summary": {
            "models": len(models),
            "stopped": [m["name"] for m in models if m["stopped"]],
            # committed nothing but a thread count (what any run can set by hand)
            "nothing_to_do": [
                m["name"] for m in models if not m["stopped"] and set(m["config"]) <= {"threads"}
            ],
            "never_more_than_5pct_slower": {
                str(n): [
                    m["name"]
                    for m in ok
                    if "microco_s" in m["runs"][str(n)]
                    and m["runs"][str(n)]["microco_s"] <= 1.05 * _best_baseline_s(m["runs"][str(n)])
                ]
                for n in RUN_LENGTHS
            },
            # the same, the remaining steps at each contender's median CPU time per step
            "never_more_than_5pct_slower_by_cpu": {
                str(n): [
                    m["name"]
                    for m in ok
                    if "microco_s" in m["runs"][str(n)]["by_cpu"]
                    and m["runs"][str(n)]["by_cpu"]["microco_s"]
                    <= 1.05 * _best_baseline_s(m["runs"][str(n)]["by_cpu"])
                ]
                for n in RUN_LENGTHS
            },
            # the A/A control per model: eager's second instance over its first (wall, CPU)
            "aa_spread": {m["name"]: [m["aa"]["ratio"], m["aa"]["cpu_ratio"]] for m in models if m.get("aa")},
            "second_run_started_tuned": [
                m["name"] for m in models if m.get("rerun", {}).get("committed_at_start")
            ],
            "faster_than_both_at_5000": [
                m["name"]
                for m in ok
                if "microco_s" in m["runs"]["5000"]
                and m["runs"]["5000"]["microco_s"] < _best_baseline_s(m["runs"]["5000"])
            ],
        },
        "wall_s": round(time.time() - started, 1),
    }
