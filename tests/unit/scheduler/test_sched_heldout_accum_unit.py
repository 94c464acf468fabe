"""Held-out round (session 41): a hand-written loop with gradient accumulation (an optimiser step
every 4 mini-batches), a per-optimiser-step OneCycleLR, bf16 autocast on CPU with a torch.amp
GradScaler and clipping after ``unscale_``, over its own shuffling ``DataLoader`` through
``hook.epoch`` (so the step counts mini-batches, as the docs require). Stopped between two
optimiser steps and started again as the next attempt, it must end as an uninterrupted run:
every loss, every learning rate, the final weights. In process, no servers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from microco.clients.scheduler import ControlChannel, TorchHook

pytestmark = pytest.mark.torch

ACCUM = 4


class _Stopped(Exception):
    pass


def _raise_exit(code):
    raise _Stopped(code)


def _train(ctl, ckpt, stop_at=None, epochs=2):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(256, 16, generator=g)
    y_all = (x_all[:, :4].sum(1) > 0).long()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_all, y_all), batch_size=16, shuffle=True
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 2)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=len(loader) // ACCUM * epochs)
    scaler = torch.amp.GradScaler("cpu")
    state: dict = {"losses": [], "lrs": []}
    hook = TorchHook(
        model,
        opt,
        stateful={"sched": sched, "scaler": scaler},
        extra_state=state,
        control_dir=str(ctl),
        checkpoint_dir=str(ckpt),
        checkpoint_every_s=0,
        exit_fn=_raise_exit,
    )
    step = hook.restore()
    for _ in range(step // len(loader), epochs):
        for x, y in hook.epoch(loader):
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUM
            scaler.scale(loss).backward()
            state["losses"].append(loss.item())
            if (step + 1) % ACCUM == 0:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                sched.step()
                state["lrs"].append(sched.get_last_lr()[0])
            step += 1
            if step == stop_at:
                ControlChannel(ctl).send("stop")
            hook.step_end(step)
    hook.finish()
    return state, model.state_dict()


@pytest.mark.parametrize("stop_at", [6, 8, 23])  # two and three mini-batches into a window; at its end
def test_a_loop_accumulating_gradients_stopped_between_optimiser_steps_ends_as_an_uninterrupted_run(
    tmp_path, stop_at
):
    whole, whole_weights = _train(tmp_path / "whole", tmp_path / "whole-ckpt")
    with pytest.raises(_Stopped):
        _train(tmp_path / "attempt-0", tmp_path / "ckpt", stop_at=stop_at)
    moved, weights = _train(tmp_path / "attempt-1", tmp_path / "ckpt")
    assert len(moved["losses"]) == len(whole["losses"]) == 32
    assert moved["losses"] == whole["losses"]  # the window's first gradients were lost before
    assert moved["lrs"] == whole["lrs"]
    for name, value in whole_weights.items():
        assert torch.equal(weights[name], value), name


def test_a_checkpoint_at_an_optimiser_steps_boundary_holds_no_gradients(tmp_path):
    with pytest.raises(_Stopped):
        _train(tmp_path / "attempt-0", tmp_path / "ckpt", stop_at=8)
    import io

    blob = (tmp_path / "ckpt").glob("*")
    saved = [torch.load(io.BytesIO(p.read_bytes()), weights_only=False) for p in blob if p.is_file()]
    saved = [s for s in saved if isinstance(s, dict) and "grads" in s]
    assert saved and saved[0]["grads"] is None  # freed by zero_grad(set_to_none=True): nothing saved
