"""A Hugging Face ``Trainer`` job as people write it: a ``transformers`` model built from a small
config (``BertForSequenceClassification``: dropout, AdamW, a linear LR schedule with warm-up)
fine-tuned by ``Trainer`` on a shuffled dataset for a few epochs. The data are the digits (8x8
images, 1,797 of them) read as sequences of 64 tokens, one per pixel's intensity (0-16).

    python -m microco.examples.hf_trainer --epochs 2 --out r.json

Under the microco scheduler the one change is ``train(trainer)`` (from
``microco.clients.scheduler.hf``) in place of ``trainer.train()``: the job is suspended in
place, or checkpointed and moved, and continues exactly (the same logged losses, the same final
weights) as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="", help="the Trainer's output_dir (default: a temporary folder)")
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="extra time per mini-batch")
    p.add_argument("--out", help="write the logged losses and a digest of the final parameters here (JSON)")
    args = p.parse_args(argv)

    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from microco.clients.scheduler.hf import train
    from microco.examples._digits import load_digits

    torch.set_num_threads(1)
    xs, ys = load_digits()
    tokens = torch.from_numpy(xs).round().long().clamp(0, 16) + 1  # 0: padding, 1-17: intensities

    class Digits(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(tokens)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": tokens[i], "labels": int(ys[i])}

    class Sleep(TrainerCallback):
        def on_step_end(self, *a: Any, **kw: Any) -> None:
            time.sleep(args.step_sleep_ms / 1000.0)

    config = BertConfig(
        vocab_size=18,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    config.num_labels = 10
    torch.manual_seed(args.seed)
    model = BertForSequenceClassification(config)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="hf-trainer-")
    targs = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup_steps=10,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=Digits(),
        callbacks=[Sleep()] if args.step_sleep_ms else None,
    )
    result = train(trainer)

    if args.out:
        digest = hashlib.sha256()
        for t in model.state_dict().values():
            digest.update(t.detach().cpu().numpy().tobytes())
        cb = next(c for c in trainer.callback_handler.callbacks if hasattr(c, "resume_from_checkpoint"))
        with open(args.out, "w") as f:
            json.dump(
                {
                    "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
                    "params_sha256": digest.hexdigest(),
                    "restored_from_step": cb.context.restored_from_step,
                    "steps": result.global_step,
                    "pid": os.getpid(),
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
