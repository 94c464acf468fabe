"""Held-out round (session 39), Hugging Face: a causal language model (a tiny GPT-2 built from
a config) trained by ``Trainer`` with gradient accumulation, a cosine schedule with warm-up and
gradient clipping, adapted as docs/scheduler.md says (``train(trainer)``), stopped mid-epoch
and trained again as the next attempt: every logged loss and the final weights equal an
uninterrupted run's. In process, no servers."""

from __future__ import annotations

import pytest

from microco.clients.scheduler import ControlChannel

pytestmark = pytest.mark.torch

pytest.importorskip("transformers")


def _go(tmp, ctl, ckpt, stop_at=None, workers=0):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from microco.clients.scheduler.hf import MicrocoTrainerCallback, train

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.ids = torch.randint(0, 32, (48, 12), generator=torch.Generator().manual_seed(2))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == stop_at:
                ControlChannel(ctl).send("stop")

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    args = TrainingArguments(
        output_dir=str(tmp / "out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=3,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=0.5,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=workers,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens())
    trainer.add_callback(Stop())

    def _exit(code):
        raise SystemExit(code)

    trainer.add_callback(
        MicrocoTrainerCallback(exit_fn=_exit, control_dir=str(ctl), checkpoint_dir=str(ckpt))
    )
    try:
        train(trainer)
    except SystemExit as exc:
        return exc.code, None, None
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return 0, losses, {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_gpt2_trainer_with_accumulation_and_cosine_moved_mid_epoch_ends_as_an_uninterrupted_run(
    tmp_path, workers
):
    import torch

    code, losses, weights = _go(
        tmp_path / "w", tmp_path / "w" / "ctl", tmp_path / "w" / "ckpt", workers=workers
    )
    assert code == 0 and len(losses) == 18  # 6 optimizer steps per epoch
    code, _, _ = _go(
        tmp_path / "m", tmp_path / "m" / "attempt-0", tmp_path / "m" / "ckpt", stop_at=8, workers=workers
    )
    assert code == 75
    code, moved, moved_weights = _go(
        tmp_path / "m", tmp_path / "m" / "attempt-1", tmp_path / "m" / "ckpt", workers=workers
    )
    assert code == 0 and moved == losses
    for name, value in weights.items():
        assert torch.equal(moved_weights[name], value), name
