"""Held-out round (session 39), PyTorch Lightning: a GAN with manual optimization (two
optimizers, noise drawn every step, a shuffling loader), adapted as docs/scheduler.md says
(``MicrocoCallback`` and ``fit(..., ckpt_path=cb.ckpt_path)``), stopped mid-epoch and fitted
again as the next attempt: every loss and the final weights equal an uninterrupted run's."""

from __future__ import annotations

import pytest

from microco.clients.scheduler import ControlChannel

pytestmark = pytest.mark.torch


def _fit(ctl, ckpt, stop_at=None):
    pl = pytest.importorskip("pytorch_lightning")
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from microco.clients.scheduler.lightning import MicrocoCallback

    class GAN(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
            self.D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(16, 1))
            self.losses: list[tuple[float, float]] = []

        def training_step(self, batch, batch_idx):
            (real,) = batch
            opt_g, opt_d = self.optimizers()
            bce = nn.functional.binary_cross_entropy_with_logits
            fake = self.G(torch.randn(real.size(0), 4))
            d_loss = bce(self.D(real), torch.ones(real.size(0), 1)) + bce(
                self.D(fake.detach()), torch.zeros(real.size(0), 1)
            )
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
            g_loss = bce(self.D(fake), torch.ones(real.size(0), 1))
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
            self.losses.append((d_loss.item(), g_loss.item()))

        def configure_optimizers(self):
            return [
                torch.optim.Adam(self.G.parameters(), lr=2e-3, betas=(0.5, 0.999)),
                torch.optim.Adam(self.D.parameters(), lr=2e-3, betas=(0.5, 0.999)),
            ]

        def on_save_checkpoint(self, checkpoint):
            checkpoint["losses"] = list(self.losses)

        def on_load_checkpoint(self, checkpoint):
            self.losses = [tuple(x) for x in checkpoint["losses"]]

    class StopAt(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.fit_loop.epoch_loop.total_batch_idx + 1 == stop_at:
                ControlChannel(ctl).send("stop")

    def _exit(code):
        raise SystemExit(code)

    torch.manual_seed(0)
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1)) * 0.5 + 1
    loader = DataLoader(TensorDataset(data), batch_size=8, shuffle=True)
    model = GAN()
    cb = MicrocoCallback(exit_fn=_exit, control_dir=str(ctl), checkpoint_dir=str(ckpt))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        callbacks=[StopAt(), cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(model, loader, ckpt_path=cb.ckpt_path)
    except SystemExit as exc:
        return exc.code, model
    return 0, model


def test_a_lightning_gan_with_manual_optimization_moved_mid_epoch_ends_as_an_uninterrupted_run(tmp_path):
    import torch

    code, whole = _fit(tmp_path / "w" / "ctl", tmp_path / "w" / "ckpt")
    assert code == 0 and len(whole.losses) == 24
    code, _ = _fit(tmp_path / "m" / "attempt-0", tmp_path / "m" / "ckpt", stop_at=11)
    assert code == 75
    code, moved = _fit(tmp_path / "m" / "attempt-1", tmp_path / "m" / "ckpt")
    assert code == 0 and moved.losses == whole.losses
    for name, value in whole.state_dict().items():
        assert torch.equal(moved.state_dict()[name], value), name
