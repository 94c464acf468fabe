"""Held-out check of the PyTorch wrapper (issue 18): public models that are not in the corpus
(``transformers``' LlamaForCausalLM, DistilBertForSequenceClassification and
BartForConditionalGeneration from tiny configs, no weights), each trained through ``AstraTorch``
beside eager on the same initial weights and batch. Reports per model and run length: stopped or
not, the losses against eager's step by step (identical, largest relative difference), what was
committed, the cache's answers and the run's wall time, beside eager's for the same steps, and
each run's projected total (the steps run, then the rest at the median of the last steps run)
over eager's. Prints one JSON line per run.

``python -m microco.benchmarks.compiler_heldout [llama,distilbert,bart] [--runs 300:300,5000:120]``
(``--runs``: run length told : steps run, per run)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

V, B, L = 256, 4, 32
RUNS = ((300, 300), (5000, 120))  # (run length told, steps run)


def _cases(tr: Any, x: Any, y: Any) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    def llama() -> Any:
        cfg = tr.LlamaConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=L,
        )  # fmt: skip
        return tr.LlamaForCausalLM(cfg)

    def distilbert() -> Any:
        cfg = tr.DistilBertConfig(
            vocab_size=V, dim=64, hidden_dim=128, n_layers=2, n_heads=2, max_position_embeddings=L,
            num_labels=3, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0,
        )  # fmt: skip
        return tr.DistilBertForSequenceClassification(cfg)

    def bart() -> Any:
        cfg = tr.BartConfig(
            vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
            max_position_embeddings=L, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        )  # fmt: skip
        return tr.BartForConditionalGeneration(cfg)

    return {
        "llama": (llama, lambda m: m(input_ids=x, labels=x).loss),
        "distilbert": (distilbert, lambda m: m(input_ids=x, labels=y).loss),
        "bart": (bart, lambda m: m(input_ids=x, labels=x).loss),
    }


def run(name: str, total: int, steps: int) -> dict[str, Any]:
    import torch
    import transformers as tr

    from microco.clients.compiler import AstraTorch
    from microco.clients.compiler.explore import LocalExplorer

    g = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, V, (B, L), generator=g), torch.randint(0, 3, (B,), generator=g)
    build, loss_of = _cases(tr, x, y)[name]

    def make() -> tuple[Any, Any, Callable[[], float]]:
        torch.manual_seed(0)
        m = build()
        m.train()
        o = torch.optim.SGD(m.parameters(), lr=0.01)

        def step() -> float:
            loss = loss_of(m)
            o.zero_grad()
            loss.backward()
            o.step()
            return float(loss.item())

        return m, o, step

    _, _, eager_step = make()
    t0 = time.perf_counter()
    eager = [eager_step() for _ in range(steps)]
    eager_s = time.perf_counter() - t0
    torch._dynamo.reset()
    model, _, step = make()
    astra = AstraTorch(model, LocalExplorer(), name=f"heldout-{name}", total_steps=total)
    got: list[float] = []
    times: list[float] = []
    error = ""
    t0 = time.perf_counter()
    try:
        for _ in range(steps):
            t = time.perf_counter()
            got.append(astra.run(step))
            times.append(time.perf_counter() - t)
    except Exception as exc:  # noqa: BLE001 - a stopped run is the finding, reported
        error = f"{type(exc).__name__}: {exc}"[:300]
    wall = time.perf_counter() - t0
    astra.restore()
    last = sorted(times[-20:])
    rest = (total - steps) * (last[len(last) // 2] if last else 0.0)
    eager_total = eager_s / steps * total
    return {
        "model": name,
        "total_steps": total,
        "steps": steps,
        "ran": len(got),
        "stopped": bool(error),
        "error": error,
        "losses_identical": got == eager,
        "max_rel": max((abs(a - b) / max(abs(a), 1e-12) for a, b in zip(eager, got)), default=None),
        "config": dict(astra.config),
        "committed": astra.committed,
        "explore_steps": astra.explore_steps,
        "whole_cache": dict(astra.whole_cache),
        "whole_probe_ms": {k: round(v) for k, v in astra.whole_probe_ms.items()},
        "wall_s": round(wall, 2),
        "eager_s": round(eager_s, 2),
        # the run's projected total over eager's (eager: its steps' mean over the whole run)
        "projected_total_ratio": round((wall + rest) / eager_total, 3) if eager_total > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    torch.set_num_threads(1)
    args = list(argv if argv is not None else sys.argv[1:])
    runs: tuple[tuple[int, int], ...] = RUNS
    if "--runs" in args:
        i = args.index("--runs")
        runs = tuple(
            (int(a), int(b)) for a, b in (r.split(":") for r in args[i + 1].split(","))
        )  # fmt: skip
        del args[i : i + 2]
    names = args or ["llama,distilbert,bart"]
    for name in names[0].split(","):
        for total, steps in runs:
            print(json.dumps(run(name, total, steps)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
