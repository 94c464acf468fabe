"""``MicrocoCallback`` (PyTorch Lightning) in one process: a stop checkpoints mid-epoch and
exits with ``EXIT_CHECKPOINTED``; ``trainer.fit(..., ckpt_path=cb.ckpt_path)`` then continues
exactly as an uninterrupted run (every loss, the final weights): the module, optimizer, per-step
LR scheduler and loop position from Lightning's checkpoint, the data position of a plain
shuffled ``DataLoader`` and the RNG states (dropout) from the callback. Also from a checkpoint
taken at an epoch's last batch. The launcher (``strategy="ddp"``, two ranks) is run through the
platform in tests/integration/scheduler/test_sched_lightning.py."""

from __future__ import annotations

import pytest
from _support import params_sha256

from microco.clients.scheduler import EXIT_CHECKPOINTED, ControlChannel
from microco.clients.scheduler._ranks import read_records

pytestmark = pytest.mark.torch

BATCHES = 12  # per epoch


@pytest.fixture(scope="module")
def fit():
    """``fit(epochs, extra_callbacks, **callback_kwargs) -> (exit code, module, callback)``.
    Lightning is imported here, not at collection (every test worker collects every file)."""
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
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def on_save_checkpoint(self, checkpoint):
            checkpoint["losses"] = list(self.losses)

        def on_load_checkpoint(self, checkpoint):
            self.losses = list(checkpoint["losses"])

    class StopAt(pl.Callback):
        """Asks the job to stop (as the agent does) at the end of batch ``step``."""

        def __init__(self, ctl, step: int) -> None:
            self.ctl, self.step = ctl, step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.fit_loop.epoch_loop.total_batch_idx + 1 == self.step:
                ControlChannel(self.ctl).send("stop")

    def run(epochs: int, stop_at=None, **cb_kwargs):
        torch.manual_seed(0)  # the weights, the shuffle and dropout draw from it
        g = torch.Generator().manual_seed(1)
        x = torch.randn(BATCHES * 8, 8, generator=g)
        y = torch.randint(0, 3, (BATCHES * 8,), generator=g)
        loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
        model = Module()
        cb = MicrocoCallback(exit_fn=_exit, **cb_kwargs)
        extra = [StopAt(*stop_at)] if stop_at else []
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=epochs,
            callbacks=[*extra, cb],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        try:
            trainer.fit(model, loader, ckpt_path=cb.ckpt_path)
        except SystemExit as exc:
            return exc.code, model, cb
        return 0, model, cb

    return run


def _exit(code: int) -> None:
    raise SystemExit(code)


@pytest.fixture(scope="module")
def reference(fit):
    code, model, cb = fit(3)
    assert code == 0 and cb.step == 3 * BATCHES and len(model.losses) == 3 * BATCHES
    return model.losses, params_sha256(model)


def test_stop_mid_epoch_then_fit_again_continues_exactly(fit, tmp_path, reference):
    ckpt, ctl = tmp_path / "ckpt", tmp_path / "ctl"
    stop = BATCHES + 5  # mid-way through the second epoch
    code, model, cb = fit(3, (ctl, stop), checkpoint_dir=ckpt, control_dir=ctl)
    assert code == EXIT_CHECKPOINTED
    assert [(r["rank"], r["state"], r["step"]) for r in read_records(ctl)] == [(0, "checkpointed", stop)]
    assert cb.ckpt_path == str(ckpt / "checkpoint")
    assert model.losses == reference[0][:stop]

    code, model, cb = fit(3, checkpoint_dir=ckpt, control_dir=tmp_path / "ctl2")
    assert code == 0 and cb.context.restored_from_step == stop and cb.step == 3 * BATCHES
    assert model.losses == reference[0]  # bit-for-bit: data order, dropout, LR schedule
    assert params_sha256(model) == reference[1]


def test_restore_from_a_checkpoint_at_an_epoch_end(fit, tmp_path, reference):
    """Periodic checkpoints at every boundary of a one-epoch fit: the last is at the epoch's
    last batch. A fit for three epochs from it goes on with the second epoch; stopped in the
    third (whose order it must know from its own start) and restored, it ends exactly."""
    ckpt, ctl = tmp_path / "ckpt", tmp_path / "ctl"
    code, _, cb = fit(1, checkpoint_dir=ckpt, checkpoint_every_s=1e-9)
    assert code == 0 and cb.context.checkpoint_step == BATCHES
    stop = 2 * BATCHES + 3
    code, model, cb = fit(3, (ctl, stop), checkpoint_dir=ckpt, control_dir=ctl)
    assert code == EXIT_CHECKPOINTED and cb.context.restored_from_step == BATCHES
    assert model.losses == reference[0][:stop]
    code, model, cb = fit(3, checkpoint_dir=ckpt)
    assert code == 0 and cb.context.restored_from_step == stop
    assert model.losses == reference[0]
    assert params_sha256(model) == reference[1]


def test_without_the_scheduler_the_callback_only_counts(fit, reference):
    code, model, cb = fit(1)
    assert code == 0 and cb.ckpt_path is None and cb.step == BATCHES
    assert model.losses == reference[0][:BATCHES]
