"""Held-out round (session 41): a DistributedDataParallel loop in two processes (gloo, a
``DistributedSampler``, dropout seeded per rank) that accumulates gradients over 2 mini-batches
under DDP's ``no_sync`` (so the ranks hold different gradients between optimiser steps) and keeps
its own per-rank values in ``extra_state`` (each rank's losses). Stopped between two optimiser
steps and started again, both ranks must end as in an uninterrupted run: every rank's losses
and the weights. Two processes over a ``FileStore``, no servers (``torchrun`` through the
platform: tests/integration/scheduler/test_sched_torchrun.py)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

ACC = 2


class _Stopped(Exception):
    pass


def _raise_exit(code):
    raise _Stopped(code)


def _rank(rank, store_path, ctl, ckpt, out, stop_at):
    import contextlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from microco.clients.scheduler import ControlChannel, TorchHook

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        x_all = torch.randn(96, 8, generator=g)
        data = torch.utils.data.TensorDataset(x_all, (x_all[:, :2].sum(1) > 0).long())
        sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=True, seed=0)
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
        net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2)
        )
        model = DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        torch.manual_seed(100 + rank)  # each rank its own dropout
        state: dict = {"losses": []}
        hook = TorchHook(
            model,
            opt,
            extra_state=state,
            control_dir=str(ctl),
            checkpoint_dir=str(ckpt),
            checkpoint_every_s=0,
            exit_fn=_raise_exit,
        )
        step = hook.restore()
        try:
            for epoch in range(step // len(loader), 2):
                sampler.set_epoch(epoch)
                for x, y in hook.epoch(loader):
                    last = (step + 1) % ACC == 0
                    with contextlib.nullcontext() if last else model.no_sync():
                        loss = torch.nn.functional.cross_entropy(model(x), y) / ACC
                        loss.backward()
                    state["losses"].append(loss.item())
                    if last:
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    step += 1
                    if rank == 0 and step == stop_at:
                        ControlChannel(ctl).send("stop")
                    hook.step_end(step)
        except _Stopped:
            return
        params = [t.tolist() for t in net.state_dict().values()]
        with open(f"{out}-{rank}.json", "w") as f:
            json.dump({"losses": state["losses"], "params": params}, f)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, name, ctl, ckpt, stop_at=None):
    import torch.multiprocessing as mp

    out = tmp_path / name
    mp.spawn(_rank, args=(str(tmp_path / f"store-{name}"), ctl, ckpt, str(out), stop_at), nprocs=2)
    return (
        [json.loads((tmp_path / f"{name}-{r}.json").read_text()) for r in (0, 1)] if stop_at is None else None
    )


def test_ddp_ranks_accumulating_under_no_sync_stopped_between_optimiser_steps_end_as_an_uninterrupted_run(
    tmp_path,
):
    whole = _run(tmp_path, "whole", tmp_path / "w", tmp_path / "wc")
    _run(tmp_path, "first", tmp_path / "a0", tmp_path / "c", stop_at=7)  # one mini-batch into a window
    moved = _run(tmp_path, "moved", tmp_path / "a1", tmp_path / "c")
    for rank in (0, 1):
        # rank 1's losses were rank 0's up to the stop (one extra_state, rank 0's, for both),
        # and the weights differed (rank 0's window gradient on both ranks)
        assert moved[rank]["losses"] == whole[rank]["losses"], rank
        assert moved[rank]["params"] == whole[rank]["params"], rank
