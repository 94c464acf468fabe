"""Astra on data-parallel replicas (issue 18, session 40): two gloo ranks on this machine's CPU,
each a ``DistributedDataParallel`` model trained with AdamW on its own batches, plain against
``AstraTorch`` around the DDP module (the ranks exploring together: ``_replicas``), interleaved
(plain, Astra, then Astra, plain, ...; a fresh model from the same seed each run, every run told
its length). One intra-op thread per rank to start with (two ranks on a small machine).

Per run: its wall time (the slower rank's, from its first step to its last: exploration
included), the median step after the first ten (the slower rank's), what Astra committed, the
largest loss difference from the plain run of the same round (any rank), and whether the two
ranks' weights ended equal (to the bit: one model).

``python -m microco.benchmarks.compiler_ddp [--steps 300] [--rounds 4] [--models conv,mlp] [--json]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODELS = ("conv", "mlp")


def _model(kind: str) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "conv":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
    layers: list[Any] = [nn.Linear(64, 128), nn.ReLU()]
    for _ in range(10):
        layers += [nn.Linear(128, 128), nn.LayerNorm(128), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(128, 10))


def _batches(kind: str, rank: int) -> list[tuple[Any, Any]]:
    import torch

    g = torch.Generator().manual_seed(100 + rank)
    shape = (16, 3, 16, 16) if kind == "conv" else (32, 64)
    return [
        (torch.randn(*shape, generator=g), torch.randint(0, 10, (shape[0],), generator=g)) for _ in range(8)
    ]


def _rank(rank: int, world: int, port: int, opts: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from microco.clients.compiler import AstraTorch
    from microco.clients.compiler.explore import LocalExplorer
    from microco.common import MemoryKV

    rows: list[dict[str, Any]] = []
    for kind in opts["models"]:
        batches = _batches(kind, rank)
        for rnd in range(opts["rounds"]):
            for how in ("plain", "astra") if rnd % 2 == 0 else ("astra", "plain"):
                ddp = nn.parallel.DistributedDataParallel(_model(kind))
                opt = torch.optim.AdamW(ddp.parameters(), 1e-3)
                astra = (
                    AstraTorch(
                        ddp,
                        LocalExplorer(MemoryKV()),
                        name=f"ddp-{kind}",
                        total_steps=opts["steps"],
                        compile_choices=("eager",),
                        explore_replicas=True,
                    )
                    if how == "astra"
                    else None
                )

                def step(x: Any, y: Any, ddp: Any = ddp, opt: Any = opt) -> float:
                    loss = F.cross_entropy(ddp(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    return float(loss.item())

                dist.barrier()
                losses, times = [], []
                t0 = time.perf_counter()
                for i in range(opts["steps"]):
                    x, y = batches[i % len(batches)]
                    s0 = time.perf_counter()
                    losses.append(astra.run(step, x, y) if astra is not None else step(x, y))
                    times.append(time.perf_counter() - s0)
                wall = torch.tensor([time.perf_counter() - t0, statistics.median(times[10:]) * 1e3])
                dist.all_reduce(wall, op=dist.ReduceOp.MAX)
                rows.append(
                    {
                        "model": kind,
                        "round": rnd,
                        "how": how,
                        "rank": rank,
                        "wall_s": wall[0].item(),
                        "median_step_ms": wall[1].item(),
                        "losses": losses,
                        "config": astra.config if astra is not None else {},
                        "explore_steps": astra.explore_steps if astra is not None else 0,
                        "coordinated": astra is not None and astra.replicas is not None,
                        # the replica's weights at the end (the ranks' must be one model)
                        "weights": hashlib.sha256(
                            b"".join(p.detach().numpy().tobytes() for p in ddp.parameters())
                        ).hexdigest(),
                    }
                )
                if astra is not None:
                    astra.restore()
    Path(out, f"rank{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def run(steps: int, rounds: int, models: tuple[str, ...]) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = {"steps": steps, "rounds": rounds, "models": list(models)}
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(2, port, opts, out), nprocs=2, join=True)
        rows = [r for k in range(2) for r in json.loads(Path(out, f"rank{k}.json").read_text())]
    summary: dict[str, Any] = {"steps": steps, "rounds": rounds, "models": {}}
    for kind in models:
        runs = [r for r in rows if r["model"] == kind and r["rank"] == 0]
        by = {(r["round"], r["how"]): r for r in runs}
        diffs = []
        for rnd in range(rounds):
            for rank in range(2):
                mine = {(r["round"], r["how"]): r for r in rows if r["model"] == kind and r["rank"] == rank}
                a, p = mine[(rnd, "astra")]["losses"], mine[(rnd, "plain")]["losses"]
                diffs.append(max(abs(x - y) for x, y in zip(a, p, strict=True)))
        summary["models"][kind] = {
            "plain_wall_s": [by[(i, "plain")]["wall_s"] for i in range(rounds)],
            "astra_wall_s": [by[(i, "astra")]["wall_s"] for i in range(rounds)],
            "ratio": [by[(i, "astra")]["wall_s"] / by[(i, "plain")]["wall_s"] for i in range(rounds)],
            "plain_step_ms": [by[(i, "plain")]["median_step_ms"] for i in range(rounds)],
            "astra_step_ms": [by[(i, "astra")]["median_step_ms"] for i in range(rounds)],
            "committed": [by[(i, "astra")]["config"] for i in range(rounds)],
            "explore_steps": [by[(i, "astra")]["explore_steps"] for i in range(rounds)],
            "coordinated": all(by[(i, "astra")]["coordinated"] for i in range(rounds)),
            "same_commit_on_both_ranks": all(
                r["config"] == by[(r["round"], "astra")]["config"]
                for r in rows
                if r["model"] == kind and r["how"] == "astra"
            ),
            "max_loss_diff": max(diffs),
            "replicas_equal": all(
                r["weights"] == o["weights"]
                for r in rows
                for o in rows
                if r["model"] == o["model"] == kind and (r["round"], r["how"]) == (o["round"], o["how"])
            ),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    summary = run(a.steps, a.rounds, tuple(m for m in a.models.split(",") if m))
    if a.json:
        print(json.dumps(summary, indent=1))
        return 0
    for kind, m in summary["models"].items():
        print(
            f"{kind}: astra/plain wall {', '.join(f'{r:.3f}' for r in m['ratio'])} "
            f"(median {statistics.median(m['ratio']):.3f}); steps plain {m['plain_step_ms']} astra "
            f"{m['astra_step_ms']} ms; committed {m['committed']} after {m['explore_steps']} explored steps; "
            f"same commit on both ranks {m['same_commit_on_both_ranks']}; replicas equal {m['replicas_equal']}; max loss diff {m['max_loss_diff']:.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
