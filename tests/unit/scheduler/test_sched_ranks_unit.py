"""Multi-process jobs as one unit: ranks sharing a control directory (a launcher's) agree on
each command at one boundary, and the agent's verdict on an exit comes from the ranks'
records, whatever code a launcher returned."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from microco.clients.scheduler import EXIT_CHECKPOINTED, ControlChannel, JobContext
from microco.clients.scheduler._job import _ACTION_CODES
from microco.clients.scheduler._ranks import EXIT_LOST, classify_exit, last_error_line, read_records


class _Group:
    """Stands in for a process group's broadcast: every rank gets rank 0's values."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n)
        self.slot: list[int] = []

    def agree(self, rank: int):
        def f(values):
            if rank == 0:
                self.slot = list(values)
            self.barrier.wait(timeout=20)
            out = list(self.slot)
            self.barrier.wait(timeout=20)
            return out

        return f


STOP_CODE = _ACTION_CODES["stop"]


class _LeavingGroup(_Group):
    """A broadcast whose root returns once it has sent: a gloo broadcast from rank 0 does not
    wait for the others to receive; rank 0 then exits, and a rank still receiving finds the
    connection gone."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.stopping: dict[int, bool] = {}

    def agree(self, rank: int):
        f = super().agree(rank)

        def g(values):
            if self.stopping.get(rank):  # a stop was agreed: the ranks' last word before they exit
                if rank == 0:
                    return list(values)
                raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:29500")
            out = f(values)
            self.stopping[rank] = out[0] == STOP_CODE
            return out

        return g


def _run_ranks(tmp_path, n=2, every_s=0.0, group=None):
    group = group or _Group(n)
    saves: list[tuple[int, int]] = []
    ctxs, results = [], {}
    exits: dict[int, float] = {}

    def exit_fn(code):
        exits[len(exits)] = time.time()
        raise SystemExit(code)

    for rank in range(n):
        c = JobContext(
            control_dir=tmp_path / "ctl",
            checkpoint_dir=tmp_path / "ckpt",
            devices=["n/0"],
            exit_fn=exit_fn,
            checkpoint_every_s=every_s,
        )
        c.use_group(rank, n, group.agree(rank))
        c.save = lambda step, rank=rank: saves.append((rank, step)) or f"{step}:rank{rank}".encode()
        ctxs.append(c)

    def train(c):
        try:
            for s in range(1, 100000):
                time.sleep(0.002)
                c.step_end(s)
        except SystemExit as e:
            results[c.rank] = e.code

    threads = [threading.Thread(target=train, args=(c,), daemon=True) for c in ctxs]
    for t in threads:
        t.start()
    _run_ranks.exits = exits  # type: ignore[attr-defined]
    return ctxs, threads, results, saves


def test_no_rank_leaves_a_stop_before_every_rank_recorded_its_checkpoint(tmp_path):
    # Before: the ranks' last word was a broadcast from rank 0, which rank 0 could leave at once;
    # rank 1, still receiving, failed with an uncaught error. Ranks sharing a control directory
    # now wait for each other's records.
    ctxs, threads, results, _ = _run_ranks(tmp_path, group=_LeavingGroup(2))
    ch = ControlChannel(tmp_path / "ctl")
    ch.wait_status(lambda s: s["step"] >= 3, 20)
    ch.send("stop")
    for t in threads:
        t.join(20)
    assert results == {0: EXIT_CHECKPOINTED, 1: EXIT_CHECKPOINTED}
    recs = read_records(tmp_path / "ctl")
    assert [(r["rank"], r["state"]) for r in recs] == [(0, "checkpointed"), (1, "checkpointed")]
    first_exit = min(_run_ranks.exits.values())  # type: ignore[attr-defined]
    assert all(r["at"] <= first_exit for r in recs)  # every record was there before any exit


def test_ranks_sharing_a_control_dir_park_resume_and_stop_together(tmp_path):
    ctxs, threads, results, saves = _run_ranks(tmp_path)
    ch = ControlChannel(tmp_path / "ctl")
    ch.wait_status(lambda s: s["step"] >= 3, 20)
    st = ch.wait_ack(ch.send("suspend"), 20)
    assert st["state"] == "parked"
    deadline = time.monotonic() + 60
    while not all(c.state == "parked" for c in ctxs) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [c.state for c in ctxs] == ["parked", "parked"]
    assert ctxs[0].step == ctxs[1].step == st["step"]  # one boundary for both
    # every rank took part in the checkpoint (it may be a collective); rank 0's was written
    assert sorted(saves) == [(0, st["step"]), (1, st["step"])]
    assert (tmp_path / "ckpt" / "checkpoint").read_bytes() == f"{st['step']}:rank0".encode()
    assert ctxs[0].reporter and not ctxs[1].reporter  # rank 0 alone writes the status
    ch.wait_ack(ch.send("resume"), 20)
    ch.wait_status(lambda s: s["step"] >= st["step"] + 3, 20)
    ch.send("stop")
    for t in threads:
        t.join(20)
    assert results == {0: EXIT_CHECKPOINTED, 1: EXIT_CHECKPOINTED}
    assert ctxs[0].step == ctxs[1].step
    recs = read_records(tmp_path / "ctl")
    assert [(r["rank"], r["state"], r["step"]) for r in recs] == [
        (0, "checkpointed", ctxs[0].step),
        (1, "checkpointed", ctxs[0].step),
    ]
    # a launcher's own exit code (torchrun: 1) does not hide the checkpointed exit
    code, msg = classify_exit(1, tmp_path / "ctl")
    assert code == EXIT_CHECKPOINTED and f"checkpointed at step {ctxs[0].step}" in msg


def test_periodic_checkpoint_is_rank0s_timer_agreed_by_all(tmp_path):
    _, threads, _, saves = _run_ranks(tmp_path, every_s=0.05)
    ch = ControlChannel(tmp_path / "ctl")
    deadline = time.monotonic() + 60
    while len(saves) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    ch.send("stop")
    for t in threads:
        t.join(20)
    by_rank = {r: [s for rr, s in saves if rr == r] for r in (0, 1)}
    assert len(by_rank[0]) >= 3 and by_rank[0] == by_rank[1]  # same steps on both ranks


def _records(tmp_path, *recs):
    for r in recs:
        (tmp_path / f"rank-{r['rank']}.json").write_text(json.dumps(r))


def test_a_rank_that_vanished_is_lost_not_failed(tmp_path):
    # rank 1 killed (no word); rank 0 saw its peer go (a collective error) or was SIGTERMed
    _records(
        tmp_path,
        {
            "rank": 0,
            "state": "failed",
            "comm": True,
            "error": "RuntimeError: Connection closed by peer",
            "world": 2,
        },
        {"rank": 1, "state": "running", "world": 2},
    )
    code, msg = classify_exit(1, tmp_path, "ChildFailedError:\n=====\n  exitcode  : -9")
    assert code == EXIT_LOST and code < 0
    assert "rank 1" in msg and "\n" not in msg


def test_a_rank_that_raised_fails_the_job_with_its_error_line(tmp_path):
    _records(
        tmp_path,
        {
            "rank": 0,
            "state": "failed",
            "comm": False,
            "error": "ValueError: bad batch",
            "world": 2,
            "at": 2.0,
        },
        {
            "rank": 1,
            "state": "failed",
            "comm": True,
            "error": "RuntimeError: gloo closed",
            "world": 2,
            "at": 1.0,
        },
    )
    code, msg = classify_exit(1, tmp_path, "torchrun banner\n======")
    assert code == 1
    assert msg == "rank 0: ValueError: bad batch (exited with 1)"


def test_exit_without_records_names_the_error_line_of_the_log(tmp_path):
    tail = "Traceback (most recent call last):\n  File \"x.py\", line 3\nKeyError: 'lr'\n"
    assert classify_exit(3, tmp_path, tail) == (3, "exited with 3: KeyError: 'lr'")
    assert last_error_line("no error here\nlast words\n") == "last words"
    assert classify_exit(0, tmp_path) == (0, "")
    assert classify_exit(-9, tmp_path)[1] == "killed by SIGKILL"


def test_uncaught_exception_is_recorded_as_one_line(tmp_path):
    code = (
        "from microco.clients.scheduler import JobContext\n"
        f"c = JobContext(control_dir={str(tmp_path)!r})\n"
        "c.step_end(1)\n"
        "raise ValueError('first line\\nsecond line')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    (rec,) = read_records(tmp_path)
    assert rec["state"] == "failed" and rec["error"] == "ValueError: first line" and not rec["comm"]
    assert classify_exit(1, tmp_path, p.stderr)[1] == "ValueError: first line (exited with 1)"


@pytest.mark.parametrize("world", [1])
def test_single_process_records_do_not_make_a_lost_job(tmp_path, world):
    _records(tmp_path, {"rank": 0, "state": "running", "world": world})
    assert classify_exit(2, tmp_path, "SystemExit: 2")[0] == 2


def test_a_resize_changes_torchs_compute_threads(tmp_path):
    torch = pytest.importorskip("torch")
    from microco.clients.scheduler import TorchHook

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        model = torch.nn.Linear(2, 2)
        hook = TorchHook(model, control_dir=tmp_path / "ctl", devices=["n/0"])
        hook.context.on_gpu = False
        ch = ControlChannel(tmp_path / "ctl")
        hook.step_end(1)
        ch.send("resize", ["n/0", "n/1", "n/2"])
        hook.step_end(2)
        assert hook.devices == ["n/0", "n/1", "n/2"] and torch.get_num_threads() == 3
        ch.send("resize", ["n/0"])
        hook.step_end(3)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_lr_schedulers_and_other_stateful_objects_are_checkpointed(tmp_path):
    torch = pytest.importorskip("torch")
    from microco.clients.scheduler import TorchHook

    def build():
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        hook = TorchHook(model, opt, stateful={"sched": sched}, checkpoint_dir=tmp_path / "ckpt")
        return model, opt, sched, hook

    model, opt, sched, hook = build()
    for step in range(5):
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        sched.step()
        hook.step_end(step + 1)
    hook.checkpoint()
    _, opt2, sched2, hook2 = build()
    assert hook2.restore() == 5
    assert sched2.state_dict() == sched.state_dict() and opt2.param_groups[0]["lr"] == 0.25
    with pytest.raises(TypeError, match="no state_dict"):
        TorchHook(model, opt, stateful={"x": object()})


SIGTERM_AFTER_STOP = """
import signal, sys
from microco.clients.scheduler import ControlChannel, JobContext

def lightning_like(signum, frame):  # Lightning's handler broadcasts the signal to the other ranks
    raise RuntimeError("[gloo] Read error [127.0.0.1]:10120: Connection reset by peer")

signal.signal(signal.SIGTERM, lightning_like)
c = JobContext(control_dir=sys.argv[1], checkpoint_dir=sys.argv[2], devices=["n/0"], checkpoint_every_s=0)
c.use_group(0, 2, lambda values: list(values))  # rank 0 of 2; rank 1 never records
c.save = lambda step: b"weights"
c.step_end(1)
ControlChannel(sys.argv[1]).send("stop")
c.step_end(2)
"""


def test_a_sigterm_after_a_ranks_checkpoint_is_recorded_leaves_it_checkpointed(tmp_path):
    # CI, session 43: once every rank of a Lightning DDP job recorded its checkpoint, the agent
    # ended the launcher (SIGTERM); Lightning's handler broadcast the signal to ranks already
    # gone, and its error turned the rank's record from checkpointed to failed.
    ctl, ckpt = tmp_path / "ctl", tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_AFTER_STOP, str(ctl), str(ckpt)])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any(r.get("state") == "checkpointed" for r in read_records(ctl)):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the rank left without waiting for the other"
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        proc.kill()
    assert [(r["rank"], r["state"]) for r in read_records(ctl)] == [(0, "checkpointed")]
    assert proc.returncode == -signal.SIGTERM
    code, _ = classify_exit(proc.returncode, ctl)
    assert code == EXIT_CHECKPOINTED
