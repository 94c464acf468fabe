"""A Hugging Face ``Trainer`` job under the scheduler (``microco.clients.scheduler.hf.train``), in
one process: a stop mid-epoch writes the Trainer's own checkpoint under the job's checkpoint
directory and exits with ``EXIT_CHECKPOINTED``; ``train(trainer)`` in a new Trainer then goes on
exactly as an uninterrupted run (every logged loss, the final weights): model, optimizer, linear
LR schedule, dropout's RNG and the shuffled data's position. A suspend parks at a step's end and
resumes in place. Before this module a Trainer job could only run to its end or lose its work."""

from __future__ import annotations

import threading

import pytest
from _support import params_sha256

from microco.clients.scheduler import EXIT_CHECKPOINTED, ControlChannel
from microco.clients.scheduler._ranks import read_records

pytestmark = pytest.mark.torch

BATCHES = 10  # per epoch


@pytest.fixture(scope="module")
def run():
    """``run(tmp, stop_at=None, suspend_at=None, **context) -> (exit code, trainer, callback)``."""
    pytest.importorskip("transformers")
    import torch
    from torch import nn
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from microco.clients.scheduler.hf import MicrocoTrainerCallback, train

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))

        def forward(self, x, labels=None):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Data(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(1)
            self.x = torch.randn(BATCHES * 8, 8, generator=g)
            self.y = torch.randint(0, 3, (BATCHES * 8,), generator=g)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i], "labels": self.y[i]}

    class Control(TrainerCallback):
        """Sends the agent's commands at given steps' ends (before the microco callback's)."""

        def __init__(self, ctl, at: dict[int, str]) -> None:
            self.ctl, self.at = ctl, at

        def on_step_end(self, args, state, control, **kw):
            action = self.at.get(state.global_step)
            if action == "suspend":
                channel = ControlChannel(self.ctl)
                channel.send("suspend")
                # The agent resumes it a moment later, from another thread.
                threading.Timer(0.3, lambda: channel.send("resume")).start()
            elif action:
                ControlChannel(self.ctl).send(action)

    def go(tmp, at=None, logging_steps=1, **context):
        torch.manual_seed(0)
        args = TrainingArguments(
            output_dir=str(tmp / "out"),
            per_device_train_batch_size=8,
            num_train_epochs=3,
            learning_rate=0.05,
            logging_steps=logging_steps,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=Net(), args=args, train_dataset=Data())
        if at:
            trainer.add_callback(Control(context["control_dir"], at))
        cb = MicrocoTrainerCallback(exit_fn=_exit, **context)
        trainer.add_callback(cb)
        try:
            out = train(trainer)
        except SystemExit as exc:
            return exc.code, trainer, cb
        assert out.global_step == 3 * BATCHES
        return 0, trainer, cb

    return go


def _exit(code: int) -> None:
    raise SystemExit(code)


def _losses(trainer) -> list[float]:
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


@pytest.fixture(scope="module")
def reference(run, tmp_path_factory):
    code, trainer, cb = run(tmp_path_factory.mktemp("ref"))
    assert code == 0 and cb.step == 3 * BATCHES and len(_losses(trainer)) == 3 * BATCHES
    return _losses(trainer), params_sha256(trainer.model)


def test_stop_mid_epoch_then_train_again_continues_exactly(run, tmp_path, reference):
    ckpt, ctl = tmp_path / "ckpt", tmp_path / "ctl"
    stop = BATCHES + 4  # mid-way through the second epoch
    code, trainer, cb = run(tmp_path, {stop: "stop"}, checkpoint_dir=ckpt, control_dir=ctl)
    assert code == EXIT_CHECKPOINTED
    assert [(r["rank"], r["state"], r["step"]) for r in read_records(ctl)] == [(0, "checkpointed", stop)]
    assert cb.resume_from_checkpoint == str(ckpt / "hf" / f"checkpoint-{stop}")
    assert _losses(trainer) == reference[0][:stop]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("checkpoint-*"))

    code, trainer, cb = run(tmp_path, checkpoint_dir=ckpt, control_dir=tmp_path / "ctl2")
    assert code == 0 and cb.context.restored_from_step == stop and cb.step == 3 * BATCHES
    assert _losses(trainer) == reference[0]  # bit for bit: data order, dropout, LR schedule
    assert params_sha256(trainer.model) == reference[1]


def test_suspend_parks_and_resumes_in_place_and_old_checkpoints_go(run, tmp_path, reference):
    ckpt, ctl = tmp_path / "ckpt", tmp_path / "ctl"
    code, trainer, cb = run(tmp_path, {3: "suspend", 12: "suspend"}, checkpoint_dir=ckpt, control_dir=ctl)
    assert code == 0 and cb.step == 3 * BATCHES
    assert _losses(trainer) == reference[0] and params_sha256(trainer.model) == reference[1]
    # Each suspend wrote a checkpoint; only the one the job's file names is kept.
    assert sorted(p.name for p in (ckpt / "hf").iterdir()) == ["checkpoint-12"]
    assert cb.resume_from_checkpoint == str(ckpt / "hf" / "checkpoint-12")


def test_a_stop_inside_a_logging_window_logs_what_an_uninterrupted_run_logs(run, tmp_path_factory):
    """``logging_steps=4``: the loss of steps 13-16 is logged at 16; a stop at 14 must carry the
    two steps' accumulated loss over (the Trainer's checkpoint does not)."""
    code, ref, _ = run(tmp_path_factory.mktemp("ref4"), logging_steps=4)
    assert code == 0
    tmp = tmp_path_factory.mktemp("stop4")
    ckpt, ctl = tmp / "ckpt", tmp / "ctl"
    code, _, _ = run(tmp, {14: "stop"}, logging_steps=4, checkpoint_dir=ckpt, control_dir=ctl)
    assert code == EXIT_CHECKPOINTED
    code, trainer, cb = run(tmp, logging_steps=4, checkpoint_dir=ckpt, control_dir=tmp / "ctl2")
    assert code == 0 and cb.context.restored_from_step == 14
    assert _losses(trainer) == _losses(ref)
    assert params_sha256(trainer.model) == params_sha256(ref.model)


def test_a_checkpoint_whose_folder_is_gone_starts_the_run_again(run, tmp_path, reference):
    """The job's file names a Trainer folder someone removed: the Trainer starts at step 0, and
    so does the job's step (it said the file's step before, while training began again)."""
    import shutil

    ckpt, ctl = tmp_path / "ckpt", tmp_path / "ctl"
    code, _, cb = run(tmp_path, {4: "stop"}, checkpoint_dir=ckpt, control_dir=ctl)
    assert code == EXIT_CHECKPOINTED
    shutil.rmtree(ckpt / "hf")
    code, trainer, cb = run(tmp_path, checkpoint_dir=ckpt, control_dir=tmp_path / "ctl2")
    assert code == 0 and cb.context.restored_from_step == 0 and cb.step == 3 * BATCHES
    assert _losses(trainer) == reference[0]


def test_the_callback_alone_asks_for_its_trainer(run, tmp_path):
    pytest.importorskip("transformers")
    import torch
    from transformers import Trainer, TrainingArguments

    from microco.clients.scheduler.hf import MicrocoTrainerCallback

    model = torch.nn.Linear(2, 2)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1)
    ds = [{"input": torch.zeros(2)}]
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[MicrocoTrainerCallback()])
    with pytest.raises(RuntimeError, match="needs its Trainer"):
        trainer.train()
