"""A PyTorch Lightning job as people write it: a ``LightningModule`` (dropout, SGD with momentum,
a per-step LR schedule) trained by ``Trainer(accelerator="cpu", devices=2, strategy="ddp")``
on a shuffled ``DataLoader`` for a few epochs; Lightning launches the second rank itself.

    python -m microco.examples.lightning_ddp --epochs 3 --out r.json

Under the microco scheduler the one addition is ``MicrocoCallback`` and
``ckpt_path=cb.ckpt_path``: the job is suspended in place, checkpointed and moved, or restarted
after a lost rank, and continues exactly (the same losses, the same final weights) as an
uninterrupted run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="extra time per mini-batch")
    p.add_argument("--out", help="rank 0 writes losses and a digest of the final parameters here (JSON)")
    args = p.parse_args(argv)

    import pytorch_lightning as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from microco.clients.scheduler.lightning import MicrocoCallback
    from microco.examples._digits import load_digits

    torch.set_num_threads(1)

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(64, args.hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(args.hidden, 10)
            )
            self.losses: list[float] = []  # this rank's, one per batch (kept in the checkpoint)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.losses.append(loss.item())
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000.0)
            return loss

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=args.lr, momentum=0.9)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["losses"] = list(self.losses)

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.losses = list(checkpoint["losses"])

    pl.seed_everything(args.seed, workers=True, verbose=False)
    xs, ys = load_digits()
    data = TensorDataset(torch.from_numpy(xs), torch.from_numpy(ys))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)  # Lightning shards it per rank
    model = Classifier()
    cb = MicrocoCallback()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_epochs=args.epochs,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader, ckpt_path=cb.ckpt_path)

    if args.out and trainer.global_rank == 0:
        digest = hashlib.sha256()
        for t in model.state_dict().values():
            digest.update(t.detach().cpu().numpy().tobytes())
        with open(args.out, "w") as f:
            json.dump(
                {
                    "losses": model.losses,
                    "params_sha256": digest.hexdigest(),
                    "restored_from_step": cb.context.restored_from_step,
                    "steps": cb.step,
                    "world": trainer.world_size,
                    "pid": os.getpid(),
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
