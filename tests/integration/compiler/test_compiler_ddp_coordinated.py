"""Data-parallel replicas exploring together (issue 18, session 40): two gloo ranks on the CPU
(real ``torch.distributed``), each training through ``AstraTorch`` beside the same loop
without it. The ranks must run the same configuration at every step and commit the same one,
every rank's losses must stay the plain run's, a trial that fails on one rank only (in its
backward) must be rolled back and repeated by both, with no rank left waiting in a collective,
and once committed no step may pay a collective of the compiler's."""

from __future__ import annotations

import json

import pytest
from _support import needs, run_python

pytestmark = [pytest.mark.integration, pytest.mark.torch, needs("torch")]

STEPS = 24

# Each rank trains from the same seed: plain DDP, then each ``how`` through ``AstraTorch``:
# "ddp" around the DDP module; "inner" around the model, DDP built around it after; "hand" no
# DDP at all, the loop all-reducing its own gradients; "hooked" around a DDP module with a comm
# hook (whose reduction a guarded step could not redo by hand: the model's own code). One intra-op thread per rank (two ranks
# on a 2-core machine); the choices then are the optimiser's implementations (the loop,
# foreach, fused), a million-step run, so each earns its trial. ``fail``: rank 1's backward
# raises under any implementation but the one the optimiser was built with (a trial that breaks
# on one rank only). (No bias before the batch norm: its gradient is rounding noise, which Adam
# scales to steps of the learning rate whatever the implementation.)
SPAWNED = """
import json, sys

def work(rank, world, port, steps, outdir, hows, fail):
    import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from microco.clients.compiler import AstraTorch
    from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
    from microco.common import MemoryKV

    state = {"opt": None, "failed": 0}

    class Tripwire(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            group = state["opt"].param_groups[0] if state["opt"] is not None else {}
            if fail and rank == 1 and (group.get("foreach") or group.get("fused")):
                state["failed"] += 1
                raise RuntimeError("injected: this rank's backward fails under the trial")
            return g

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
            self.head = nn.Sequential(
                nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)
            )

        def forward(self, x):
            return self.head(Tripwire.apply(self.body(x)))

    def net():
        torch.manual_seed(0)
        return Net()

    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(4)]
    out = {}
    for how in ["plain"] + hows:
        model = net()
        astra = None
        wrapped = model
        if how == "inner":
            astra = AstraTorch(
                model, LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
                name=how, total_steps=10**6, compile_choices=("eager",), threads=("1",), explore_replicas=True,
            )
        if how != "hand":
            wrapped = nn.parallel.DistributedDataParallel(model)
        if how == "hooked":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            wrapped.register_comm_hook(None, default_hooks.allreduce_hook)
        if how in ("ddp", "hand", "hooked"):
            astra = AstraTorch(
                wrapped, LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
                name=how, total_steps=10**6, compile_choices=("eager",), threads=("1",), explore_replicas=True,
            )
        opt = state["opt"] = torch.optim.AdamW(wrapped.parameters(), 1e-2)
        losses, configs, agreements = [], [], []
        for i in range(steps):
            x, y = batches[i % 4]

            def step():
                loss = F.cross_entropy(wrapped(x), y)
                opt.zero_grad()
                loss.backward()
                if how == "hand":
                    for p in model.parameters():
                        p.grad.mul_(1.0 / world)
                        dist.all_reduce(p.grad)
                opt.step()
                return loss.item()

            losses.append(astra.run(step) if astra is not None else step())
            configs.append(astra.running if astra is not None else {})
            group = astra.replicas if astra is not None else None
            agreements.append(group.agreements if group is not None else -1)
        out[how] = {
            "losses": losses,
            "weights": [p.detach().flatten().tolist() for p in model.parameters()],
            "replica": astra.replica if astra is not None else "",
            "coordinated": astra is not None and astra.replicas is not None,
            "uncoordinated": astra.uncoordinated if astra is not None else "",
            "config": astra.config if astra is not None else {},
            "committed": astra.committed if astra is not None else False,
            "direct": astra.direct if astra is not None else False,
            "explore_steps": astra.explore_steps if astra is not None else 0,
            "rolled_back": astra.rolled_back if astra is not None else 0,
            "variables": [v.name for v in astra.spec().variables] if astra is not None else [],
            "configs": configs,
            "agreements": agreements,
            "failed": state["failed"],
        }
        state["failed"] = 0
    with open(f"{outdir}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    import multiprocessing, socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = multiprocessing.get_context("spawn")
    hows, fail = sys.argv[3].split(","), sys.argv[4] == "fail"
    procs = [
        ctx.Process(target=work, args=(r, 2, port, int(sys.argv[1]), sys.argv[2], hows, fail)) for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(150)
    for p in procs:  # (a rank left waiting in a collective: the test fails, not hangs)
        if p.exitcode is None:
            p.kill()
    sys.exit(max(abs(p.exitcode) if p.exitcode is not None else 99 for p in procs))
"""


def _ranks(tmp_path, hows, fail=False):
    script = tmp_path / "ranks.py"
    script.write_text(SPAWNED)
    run = run_python(
        [str(script), str(STEPS), str(tmp_path), ",".join(hows), "fail" if fail else "ok"], timeout=200
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def _same_as_plain(got, hows):
    for rank, runs in enumerate(got):
        plain = runs["plain"]
        for how in hows:
            assert runs[how]["losses"] == pytest.approx(plain["losses"], rel=1e-5, abs=1e-6), (rank, how)
            for w, p in zip(runs[how]["weights"], plain["weights"], strict=True):
                assert w == pytest.approx(p, rel=1e-4, abs=1e-5), (rank, how)
    for how in ["plain", *hows]:  # ... and the replicas stayed one model
        assert got[0][how]["weights"] == got[1][how]["weights"], how


def test_replicas_explore_together_and_commit_one_configuration(tmp_path):
    hows = ["ddp", "inner", "hand"]
    got = _ranks(tmp_path, hows)
    _same_as_plain(got, hows)
    for how in hows:
        runs = [got[r][how] for r in range(2)]
        for run in runs:
            assert run["replica"] and run["coordinated"], (how, run["uncoordinated"])
            assert run["variables"] == ["optimizer"], how  # (no channels-last under DDP)
            assert run["committed"] and run["direct"] and run["explore_steps"] > 0, how
        # the same configuration at every step, and the same commit
        assert runs[0]["configs"] == runs[1]["configs"], how
        assert runs[0]["config"] == runs[1]["config"], how
        assert len({json.dumps(c, sort_keys=True) for c in runs[0]["configs"]}) > 1, how  # (it explored)
        # once committed, the compiler runs no collective of its own
        agreements = runs[0]["agreements"]
        assert agreements[-1] == agreements[STEPS // 2], (how, agreements)


def test_a_ddp_module_whose_reduction_cannot_be_redone_keeps_the_models_own_code(tmp_path):
    got = _ranks(tmp_path, ["hooked"])
    for runs in got:
        run = runs["hooked"]
        assert run["replica"] and not run["coordinated"], run
        assert "comm hook" in run["uncoordinated"], run
        assert run["config"] == {} and run["direct"], run
        assert run["losses"] == pytest.approx(runs["plain"]["losses"], rel=1e-6, abs=1e-7)


def test_a_trial_failing_in_one_ranks_backward_is_rolled_back_on_every_rank(tmp_path):
    hows = ["ddp", "inner", "hand"]
    got = _ranks(tmp_path, hows, fail=True)
    _same_as_plain(got, hows)
    for how in hows:
        runs = [got[r][how] for r in range(2)]
        assert runs[1]["failed"] > 0 and runs[0]["failed"] == 0, how  # (rank 1's backward raised)
        assert runs[0]["rolled_back"] == runs[1]["rolled_back"] == runs[1]["failed"], how
        assert runs[0]["configs"] == runs[1]["configs"], how
        assert runs[0]["config"] == runs[1]["config"] == {"optimizer": "loop"}, how
