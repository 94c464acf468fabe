"""The job-side control protocol, in process: no sockets, no frameworks."""

from __future__ import annotations

import threading

import pytest

from microco.clients.scheduler import EXIT_CHECKPOINTED, ControlChannel, JobContext, StepBatches


def make_ctx(tmp_path):
    state = {"w": 0}

    def exit_fn(code):
        raise SystemExit(code)

    ctx = JobContext(
        control_dir=tmp_path / "ctl",
        checkpoint_dir=tmp_path / "ckpt",
        job_id="j",
        devices=["n/0"],
        exit_fn=exit_fn,
    )
    ctx.save = lambda step: f"{step}:{state['w']}".encode()

    def load(blob: bytes) -> int:
        step, w = blob.decode().split(":")
        state["w"] = int(w)
        return int(step)

    ctx.load = load
    return ctx, state, ControlChannel(tmp_path / "ctl")


def test_no_control_dir_is_a_noop(tmp_path):
    ctx = JobContext(control_dir=None, checkpoint_dir=None, devices=[])
    for s in range(1, 4):
        ctx.step_end(s)
    assert ctx.step == 3 and ctx.minibatch_ms() is not None and ctx.restore() == 0


def test_checkpoint_and_restore(tmp_path):
    ctx, state, ch = make_ctx(tmp_path)
    assert ctx.restore() == 0
    state["w"] = 7
    ctx.step_end(5)
    seq = ch.send("checkpoint")
    ctx.step_end(6)
    assert ch.status()["seq_done"] == seq and ch.status()["checkpoint_step"] == 6
    ctx2, state2, _ = make_ctx(tmp_path)
    assert ctx2.restore() == 6 and state2["w"] == 7


def test_suspend_parks_until_resume(tmp_path):
    ctx, _, ch = make_ctx(tmp_path)
    ctx.step_end(1)
    seq = ch.send("suspend")
    t = threading.Thread(target=ctx.step_end, args=(2,))
    t.start()
    parked = ch.wait_ack(seq, timeout=5)
    assert parked["state"] == "parked" and parked["checkpoint_step"] == 2
    assert t.is_alive()  # parked: the training loop does not advance
    seq = ch.send("resume", devices=["n/1"])
    t.join(5)
    assert not t.is_alive()
    st = ch.wait_ack(seq, timeout=5)
    assert st["state"] == "running" and st["devices"] == ["n/1"] and ctx.devices == ["n/1"]


def test_stop_checkpoints_and_exits_75(tmp_path):
    ctx, state, ch = make_ctx(tmp_path)
    state["w"] = 3
    ctx.step_end(4)
    ch.send("stop")
    with pytest.raises(SystemExit) as info:
        ctx.step_end(5)
    assert info.value.code == EXIT_CHECKPOINTED
    assert (tmp_path / "ckpt" / "checkpoint").read_bytes() == b"5:3"
    assert ch.status()["state"] == "checkpointed"


def test_stop_while_parked_exits(tmp_path):
    ctx, _, ch = make_ctx(tmp_path)
    seq = ch.send("suspend")
    out: dict = {}

    def run():
        try:
            ctx.step_end(1)
        except SystemExit as e:
            out["code"] = e.code

    t = threading.Thread(target=run)
    t.start()
    ch.wait_ack(seq, timeout=5)
    ch.send("stop")
    t.join(5)
    assert out["code"] == EXIT_CHECKPOINTED


def test_a_command_is_obeyed_once(tmp_path):
    ctx, _, ch = make_ctx(tmp_path)
    seq = ch.send("resize", devices=["n/0", "n/1"])
    seen = []
    ctx.on_devices = seen.append
    for s in range(1, 4):
        ctx.step_end(s)
    assert seen == [["n/0", "n/1"]] and ch.status()["seq_done"] == seq


def test_unknown_action_is_refused(tmp_path):
    with pytest.raises(ValueError):
        ControlChannel(tmp_path).send("explode")


def test_step_batches_is_a_function_of_the_step():
    a, b = StepBatches(100, 32, seed=1), StepBatches(100, 32, seed=1)
    assert a.batches_per_epoch == 3
    seq = [tuple(a.indices(s)) for s in range(7)]
    assert [tuple(b.indices(s)) for s in (6, 2, 0)] == [seq[6], seq[2], seq[0]]
    epoch0 = sorted(i for s in range(3) for i in seq[s])
    assert len(set(epoch0)) == 96  # no repeats within an epoch
    assert seq[0] != seq[3]  # epochs are shuffled differently
    with pytest.raises(ValueError):
        StepBatches(10, 0)


def test_restore_removes_partial_checkpoints_of_dead_writers(tmp_path):
    ctx, state, _ = make_ctx(tmp_path)
    state["w"] = 7
    ctx.step_end(3)
    ctx.write_checkpoint()
    # A writer killed mid-write left a temporary file; the complete checkpoint is intact.
    (tmp_path / "ckpt" / ".checkpoint.999999.tmp").write_bytes(b"half")
    ctx2, state2, _ = make_ctx(tmp_path)
    assert ctx2.restore() == 3 and state2["w"] == 7
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["checkpoint"]


def test_zygote_takes_only_plain_python_commands_of_its_interpreter():
    import sys

    from microco.services.agent._warm import parse_preload, python_target

    py = sys.executable
    assert python_target([py, "-m", "pkg.mod", "--x", "1"]) == ("module", "pkg.mod", ["--x", "1"])
    assert python_target([py, "train.py", "a"]) == ("path", "train.py", ["a"])
    assert python_target([py, "-u", "-m", "pkg"]) is None  # interpreter options: exec
    assert python_target([py, "-c", "pass"]) is None
    assert python_target(["sh", "-c", "true"]) is None
    assert python_target(["/usr/bin/env"]) is None
    assert parse_preload("none") == [] and parse_preload("") == []
    assert parse_preload("numpy, torch") == ["numpy", "torch"]
    auto = parse_preload("auto")
    assert "torch._dynamo" not in auto or "torch" in auto


def test_agent_refuses_job_ids_that_are_not_safe_directory_names(tmp_path):
    import sys

    from microco.common.errors import InvalidArgument
    from microco.services.agent import ProcessManager, discover_devices

    pm = ProcessManager(tmp_path, discover_devices("n", 1))
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(InvalidArgument):
            pm.start(bad, [sys.executable, "-c", "pass"], {}, ["n/0"])
    assert not (tmp_path / "x").exists()


def test_spread_ranks_act_on_rank0s_command_together(tmp_path):
    """Rank 0 reads the control file; every rank carries out the agreed command at the same
    boundary; only rank 0 writes the checkpoint; suspend is checkpoint-and-exit."""
    from microco.clients.scheduler import JobContext

    def exit_fn(code):
        raise SystemExit(code)

    published = []  # stands in for the broadcast: rank 0's values, call by call
    seen = {1: 0}

    def rank0_agree(values):
        published.append(list(values))
        return list(values)

    def other_agree(values):
        seen[1] += 1
        return published[seen[1] - 1]

    ctxs = []
    for rank in (0, 1):
        c = JobContext(
            control_dir=tmp_path / f"ctl{rank}",
            checkpoint_dir=tmp_path / "ckpt",
            devices=[f"n{rank}/0"],
            exit_fn=exit_fn,
        )
        c.rank, c.world_size, c.spread = rank, 2, True
        c.agree = rank0_agree if rank == 0 else other_agree
        c.save = lambda step, rank=rank: f"{step}:rank{rank}".encode()
        ctxs.append(c)
    chans = [ControlChannel(tmp_path / f"ctl{r}") for r in (0, 1)]
    for s in (1, 2):
        for c in ctxs:
            c.step_end(s)
    # The scheduler sends suspend to both ranks' agents; rank 1's own file is not what decides.
    seqs = [ch.send("suspend") for ch in chans]
    codes = []
    for c in ctxs:
        with pytest.raises(SystemExit) as info:
            c.step_end(3)
        codes.append(info.value.code)
    assert codes == [EXIT_CHECKPOINTED, EXIT_CHECKPOINTED]
    assert (tmp_path / "ckpt" / "checkpoint").read_bytes() == b"3:rank0"  # rank 0's only
    assert [ch.status()["seq_done"] for ch in chans] == seqs
    assert all(ch.status()["state"] == "checkpointed" for ch in chans)


def test_spread_ranks_ignore_their_own_file_without_rank0s_word(tmp_path):
    from microco.clients.scheduler import JobContext

    c = JobContext(control_dir=tmp_path / "ctl", checkpoint_dir=tmp_path / "ckpt", devices=["n/0"])
    c.rank, c.world_size, c.spread, c.agree = 1, 2, True, lambda values: [0, 0]
    c.save = lambda step: b"x"
    ControlChannel(tmp_path / "ctl").send("stop")
    c.step_end(1)  # rank 0 said nothing: rank 1 keeps training
    assert c.state == "running" and not (tmp_path / "ckpt" / "checkpoint").exists()


class _Clocks:
    """Wall and CPU clocks the test advances (the job reads ``time.perf_counter`` and
    ``time.process_time``)."""

    def __init__(self):
        self.wall = 100.0
        self.cpu = 5.0

    def step(self, wall_ms, cpu_ms):
        self.wall += wall_ms / 1000.0
        self.cpu += cpu_ms / 1000.0


@pytest.mark.parametrize(
    "devices, gpu, cpu_ms, want",
    [
        (["n/0"], "", 6.0, 0.6),  # 6 ms of CPU in a 10 ms mini-batch: 60% of its device busy
        (["n/0", "n/1"], "", 6.0, 0.3),  # the same over two devices (one thread each)
        (["n/0"], "", 25.0, 1.0),  # more CPU than wall (extra threads): at most the device
        (["n/0"], "0", 6.0, None),  # a GPU's busy time is not the process's CPU time
    ],
)
def test_the_job_measures_how_busy_it_keeps_its_devices(monkeypatch, devices, gpu, cpu_ms, want):
    import microco.clients.scheduler._job as job_mod

    clocks = _Clocks()
    monkeypatch.setattr(job_mod.time, "perf_counter", lambda: clocks.wall)
    monkeypatch.setattr(job_mod.time, "process_time", lambda: clocks.cpu)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpu)
    ctx = JobContext(control_dir=None, checkpoint_dir=None, devices=devices)
    clocks.step(500.0, 500.0)  # the first mini-batch (warm-up) is left out
    ctx.step_end()
    assert ctx.utilization() is None  # one mini-batch: nothing to say yet
    for _ in range(5):
        clocks.step(10.0, cpu_ms)
        ctx.step_end()
    got = ctx.utilization()
    assert got == (None if want is None else pytest.approx(want))
    assert ctx.status()["utilization"] == got


def test_a_job_waiting_on_input_reports_its_devices_mostly_idle(monkeypatch):
    """Real clocks: a mini-batch that sleeps (waits for data) keeps its device idle."""
    import time

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    ctx = JobContext(control_dir=None, checkpoint_dir=None, devices=["n/0"])
    for _ in range(4):
        time.sleep(0.02)
        ctx.step_end()
    assert ctx.utilization() is not None and ctx.utilization() < 0.3


def test_jobs_checkpoint_by_default_and_slow_checkpoints_stretch_the_interval(tmp_path, monkeypatch):
    # A job killed without MICROCO_CHECKPOINT_EVERY_S used to restart from step 0: now it
    # loses at most the default interval, stretched when its checkpoints are slow to write.
    from microco.clients.scheduler import _job

    monkeypatch.delenv(_job.ENV_CHECKPOINT_EVERY_S, raising=False)
    ctx, _, _ = make_ctx(tmp_path)
    assert not ctx.checkpoint_interval_said
    assert ctx.checkpoint_interval_s == _job.DEFAULT_CHECKPOINT_EVERY_S > 0
    ctx.step_end(1)
    assert ctx.checkpoint_step is None  # not due yet
    ctx._last_checkpoint_at -= _job.DEFAULT_CHECKPOINT_EVERY_S  # as if that long had passed
    ctx.step_end(2)
    assert ctx.checkpoint_step == 2 and (tmp_path / "ckpt" / "checkpoint").exists()
    ctx.checkpoint_ms = 60_000.0  # a minute to write: at most 1/50 of the time goes to it
    assert ctx.checkpoint_interval_s == _job.CHECKPOINT_COST_SHARE * 60.0
    # Said by the job: kept exactly; "0" turns periodic checkpoints off.
    monkeypatch.setenv(_job.ENV_CHECKPOINT_EVERY_S, "0")
    off, _, _ = make_ctx(tmp_path / "off")
    off.checkpoint_ms = 60_000.0
    assert off.checkpoint_interval_said and off.checkpoint_interval_s == 0
    monkeypatch.setenv(_job.ENV_CHECKPOINT_EVERY_S, "2.5")
    said, _, _ = make_ctx(tmp_path / "said")
    said.checkpoint_ms = 60_000.0
    assert said.checkpoint_interval_s == 2.5
