"""Held-out round (session 41), Lightning: ``Trainer(accumulate_grad_batches=3)`` (an optimiser
step every 3 batches) with ``MicrocoCallback``, stopped between two optimiser steps and fitted
again from the job's checkpoint: every loss and the final weights equal an uninterrupted run's.
(Lightning's own checkpoint holds no gradients; the callback obeys at every batch's end.)"""

from __future__ import annotations

import pytest
from _support import params_sha256

from microco.clients.scheduler import EXIT_CHECKPOINTED, ControlChannel

pytestmark = pytest.mark.torch

BATCHES = 12


def _fit(ckpt, ctl, stop_at=None):
    pl = pytest.importorskip("pytorch_lightning")
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from microco.clients.scheduler.lightning import MicrocoCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
            self.losses: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

        def on_save_checkpoint(self, checkpoint):
            checkpoint["losses"] = list(self.losses)

        def on_load_checkpoint(self, checkpoint):
            self.losses = list(checkpoint["losses"])

    class StopAt(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.fit_loop.epoch_loop.total_batch_idx + 1 == stop_at:
                ControlChannel(ctl).send("stop")

    def _exit(code):
        raise SystemExit(code)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCHES * 8, 8, generator=g)
    y = torch.randint(0, 3, (BATCHES * 8,), generator=g)
    cb = MicrocoCallback(exit_fn=_exit, checkpoint_dir=str(ckpt), control_dir=str(ctl), checkpoint_every_s=0)
    model = Module()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        accumulate_grad_batches=3,
        callbacks=[StopAt(), cb] if stop_at else [cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(
            model, DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True), ckpt_path=cb.ckpt_path
        )
    except SystemExit as exc:
        return exc.code, model
    return 0, model


@pytest.mark.parametrize("stop_at", [5, 16])  # 2 and 1 batches into a window of 3, epochs 0 and 1
def test_lightning_accumulating_gradients_stopped_between_optimiser_steps_continues_exactly(
    tmp_path, stop_at
):
    code, whole = _fit(tmp_path / "w", tmp_path / "wctl")
    assert code == 0 and len(whole.losses) == 2 * BATCHES
    code, _ = _fit(tmp_path / "ckpt", tmp_path / "ctl", stop_at=stop_at)
    assert code == EXIT_CHECKPOINTED
    code, moved = _fit(tmp_path / "ckpt", tmp_path / "ctl2")
    assert code == 0
    assert moved.losses == whole.losses  # the window's first gradients were lost
    assert params_sha256(moved) == params_sha256(whole)
