"""A job's checkpoint disk fills (session 42's held-out round, an operator's fault: other jobs'
checkpoints, or a checkpoint grown past the room). Every job that checkpointed there failed at
its next periodic checkpoint (``OSError: No space left on device`` out of ``step_end``), though
it could go on and be resumed from its last checkpoint, and the part-written file held the room
until the job's next start. Now the periodic checkpoint that finds no room is logged, nothing of
it is left, the last checkpoint stays whole, training goes on, and the next one is written once
there is room. On a 4 MiB tmpfs of its own (root only; skipped elsewhere)."""

from __future__ import annotations

import pytest

from microco.clients.scheduler import JobContext
from microco.clients.telemetry import uninstall

pytestmark = pytest.mark.integration


def test_a_full_checkpoint_disk_does_not_end_the_training(small_disk):
    size = {"bytes": 3 << 20}
    ctx = JobContext(checkpoint_dir=small_disk / "ckpt", checkpoint_every_s=1e-9)
    ctx.save = lambda step: bytes([step]) * size["bytes"]
    ctx.load = lambda blob: blob[0]
    try:
        ctx.step_end(1)  # 3 MiB written
        assert ctx.checkpoint_step == 1
        ctx.step_end(2)  # 3 MiB more does not fit beside it: training goes on
        ctx.step_end(3)
        assert ctx.step == 3 and ctx.checkpoint_step == 1
        assert "No space left" in ctx.checkpoint_error
        assert [p.name for p in (small_disk / "ckpt").iterdir()] == ["checkpoint"]  # no part left
        assert (small_disk / "ckpt" / "checkpoint").read_bytes() == bytes([1]) * (3 << 20)
        size["bytes"] = 512 << 10  # room again: the next one is written
        ctx.step_end(4)
        assert ctx.checkpoint_step == 4 and ctx.checkpoint_error == ""
        assert ctx.restore() == 4
    finally:
        uninstall(ctx.telemetry)
