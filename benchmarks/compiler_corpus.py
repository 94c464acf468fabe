"""Astra on a held-out corpus: ``microco bench compiler --corpus public [--quick] [--json]``.

Models the project did not write, built offline from code and small configurations (no weights
are downloaded): torch's own recurrent and attention modules (``nn.LSTM``, ``nn.GRU``,
``nn.LSTMCell`` called once per time step in ``forward``, ``nn.TransformerEncoder``) and, when
the ``transformers`` package is installed (``pip install microco[corpus]``), Hugging Face GPT-2,
BERT and T5 built from tiny configurations. torchvision is not in it: no torchvision build on
this machine's package index imports beside the CPU build of torch 2.13 (its operators fail to
register), and Keras models are not in it yet (see docs/compiler.md).

Per model, in one process and side by side (same initial weights, same batch): eager,
``torch.compile`` (default: Inductor) and microco (:class:`AstraTorch` with the exploration core
in-process, each step through ``astra.run`` so that a failed trial is repeated, not lost).
microco explores until it commits; then the three run interleaved round-robin and the medians
of their step times are reported. ``stopped`` is true when an exception escaped microco's step
(the user's training would have ended); ``loss_rel_diff`` compares microco's loss after its
steps with eager's after as many steps. ``runs`` gives each contender's total for runs of 300,
1,000 and 5,000 steps: its measured first steps (compile, exploration, a warm-up step) plus the
remaining steps at its interleaved median (exploration is sized for ``--run-steps``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RUN_LENGTHS = (300, 1000, 5000)


@dataclass
class Case:
    """One corpus model: how to build it (seeded) and its training loss on a fixed batch."""

    name: str
    source: str  # whose code it is
    make: Callable[[], Any]  # () -> nn.Module, seeded by the caller
    batch: Callable[[], tuple[Any, ...]]  # () -> the step's tensors
    loss: Callable[..., Any]  # (model, *batch) -> scalar loss


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


def _hf_cases() -> list[Case]:
    try:
        import transformers as tr
    except ImportError:
        return []
    import torch

    V, B, L = 256, 4, 32

    def ids() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(2)
        x = torch.randint(0, V, (B, L), generator=g)
        return x, torch.randint(0, 3, (B,), generator=g)

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


def corpus() -> list[Case]:
    return _torch_cases() + _hf_cases()


# --quick: the two whose baselines compile in seconds (dynamo does not trace torch's RNN modules,
# so torch.compile leaves them eager); the others' cold torch.compile took 4-7 minutes here.
QUICK = ("torch-lstm", "torch-gru")


def _interleaved(fns: dict[str, Callable[[], Any]], rounds: int, per_round: int) -> dict[str, float]:
    """Round-robin, the order rotated every round: the contender that runs right after another
    model's steps pays for the caches that model evicted, and a fixed order puts that on one
    (seen: three contenders running the same eager code measured 20, 27 and 28 ms)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_case(case: Case, run_steps: int, rounds: int) -> dict[str, Any]:
    import torch

    from microco.clients.compiler import AstraTorch
    from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer

    batch = case.batch()

    def make() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = case.make()
        model.train()
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def plain(model: Any, opt: Any, fwd: Any = None) -> Callable[[], Any]:
        def step() -> Any:
            loss = case.loss(fwd if fwd is not None else model, *batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return step

    counts = {"eager": 0, "static": 0, "microco": 0}

    def counted(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def step() -> Any:
            counts[name] += 1
            return fn()

        return step

    out: dict[str, Any] = {"name": case.name, "framework": "torch", "source": case.source}
    torch._dynamo.reset()
    eager_m, eager_o = make()
    eager = counted("eager", plain(eager_m, eager_o))
    t0 = time.perf_counter()
    eager()
    eager_first_s = time.perf_counter() - t0

    static: Callable[[], Any] | None = None
    static_first_s = float("nan")
    static_m, static_o = make()
    try:
        static = counted("static", plain(static_m, static_o, torch.compile(static_m)))
        t0 = time.perf_counter()
        static()
        static_first_s = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - the baseline's own failure is reported, not ours
        out["static_error"] = f"{type(exc).__name__}: {exc}"[:300]
        static = None

    torch._dynamo.reset()
    micro_m, micro_o = make()
    astra = AstraTorch(
        micro_m, LocalExplorer(policy=ExplorationPolicy()), name=case.name, total_steps=run_steps
    )
    micro_step = plain(micro_m, micro_o)
    stopped, error = False, ""

    def micro() -> Any:
        counts["microco"] += 1
        return astra.run(micro_step)

    t0 = time.perf_counter()
    try:
        while not astra.committed and counts["microco"] < run_steps:
            micro()
    except Exception as exc:  # noqa: BLE001 - what would have ended the user's training
        stopped = True
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    explore_s = time.perf_counter() - t0
    explore_steps = counts["microco"]

    contenders: dict[str, Callable[[], Any]] = {"eager": eager}
    if static is not None:
        contenders["static"] = static
    if not stopped:
        contenders["microco"] = micro
    try:
        for fn in contenders.values():
            fn()
        ms = _interleaved(contenders, rounds, 3)
    except Exception as exc:
        if "microco" not in contenders:
            raise
        stopped, error = True, f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
        contenders.pop("microco")
        ms = _interleaved(contenders, rounds, 3)

    # Loss against eager after as many steps (same weights, same batch, same optimiser).
    loss_rel = float("nan")
    if not stopped:
        while counts["eager"] < counts["microco"]:
            eager()
        with torch.no_grad():
            a = float(case.loss(eager_m, *batch))
            b = float(case.loss(micro_m, *batch))
        loss_rel = abs(a - b) / max(abs(a), 1e-12)

    def total(first_s: float, first_steps: int, step_ms: float, n: int) -> float:
        return round(first_s + max(0, n - first_steps) * step_ms / 1e3, 3)

    runs = {}
    for n in RUN_LENGTHS:
        r = {"eager_s": total(eager_first_s, 1, ms["eager"], n)}
        if "static" in ms:
            r["static_s"] = total(static_first_s, 1, ms["static"], n)
        if "microco" in ms:
            r["microco_s"] = total(explore_s, explore_steps, ms["microco"], n)
        runs[str(n)] = r
    state = astra.session.explorer.core.get(astra.spec().key) if astra.spec() is not None else None  # type: ignore[attr-defined]
    best_base = min(ms["eager"], ms.get("static", float("inf")))
    out.update(
        eager_ms=round(ms["eager"], 3),
        static_ms=round(ms["static"], 3) if "static" in ms else None,
        microco_ms=round(ms["microco"], 3) if "microco" in ms else None,
        static_compile_s=round(static_first_s, 3),
        explore_steps=explore_steps,
        trial_steps=astra.explore_steps,
        explore_s=round(explore_s, 3),
        committed=astra.committed,
        config={k: v for k, v in astra.config.items() if v not in ("off", "eager")},
        variables=[v.name for v in astra.spec().variables] if astra.spec() is not None else [],  # type: ignore[union-attr]
        structure=_structure(astra),
        interleaved_speedup=round(state.speedup, 3) if state is not None else None,
        speedup_vs_eager=round(ms["eager"] / ms["microco"], 3) if "microco" in ms else None,
        speedup_vs_static=round(ms["static"] / ms["microco"], 3)
        if "microco" in ms and "static" in ms
        else None,
        speedup_vs_best_baseline=round(best_base / ms["microco"], 3) if "microco" in ms else None,
        stopped=stopped,
        error=error[:500],
        rolled_back=astra.rolled_back,
        loss_rel_diff=loss_rel,
        runs=runs,
    )
    astra.restore()
    torch._dynamo.reset()
    return out


def _structure(astra: Any) -> dict[str, Any]:
    return {
        "regions": len(astra.runners),
        "whole_step_rewrites": astra.whole_rewrites,
        "whole_cache": dict(astra.whole_cache),
        "whole_failed": dict(astra.whole_failed),
    }


def run(args: Any) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    cases = corpus()
    names = [c.name for c in cases]
    if args.models:
        wanted = args.models.split(",")
        unknown = [w for w in wanted if w not in names]
        if unknown:
            raise SystemExit(f"unknown corpus models {unknown}; the corpus: {names}")
        cases = [c for c in cases if c.name in wanted]
    elif args.quick:
        cases = [c for c in cases if c.name in QUICK]
    run_steps = args.run_steps or 1000
    rounds = 3 if args.quick else 10
    started = time.time()
    models = []
    for case in cases:
        print(f"[bench compiler --corpus] {case.name}", file=sys.stderr, flush=True)
        models.append(bench_case(case, run_steps, rounds))
        # each model's result as it is done, on stderr: a run cut short keeps what it measured
        print(json.dumps(models[-1], default=float), file=sys.stderr, flush=True)
    ok = [m for m in models if m["microco_ms"] is not None]
    return {
        "benchmark": "compiler",
        "corpus": "public",
        "quick": args.quick,
        "command": "microco bench compiler " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_1m": os.getloadavg()[0],
        },
        "threads": args.threads,
        "run_steps": run_steps,
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
                    if m["runs"][str(n)]["microco_s"]
                    <= 1.05 * min(v for k, v in m["runs"][str(n)].items() if k != "microco_s")
                ]
                for n in RUN_LENGTHS
            },
            "faster_than_both_at_5000": [
                m["name"]
                for m in ok
                if m["runs"]["5000"]["microco_s"]
                < min(v for k, v in m["runs"]["5000"].items() if k != "microco_s")
            ],
        },
        "wall_s": round(time.time() - started, 1),
    }
