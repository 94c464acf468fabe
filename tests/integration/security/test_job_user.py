"""A job runs as a user of its own (issue 16): an agent running as root starts each job as an
unprivileged user (``--run-as``), so the job cannot read the agent's credentials; its own
directories (control, checkpoints, home) are the job user's. Run as root where the suite runs as
root; elsewhere the separation cannot be made (and the agent says so at start)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from _support import wait_until

from microco.common.errors import InvalidArgument
from microco.services.agent._devices import discover_devices
from microco.services.agent._procs import ProcessManager
from microco.services.agent._runas import DEFAULT_JOB_UID, JobUser, blocked, resolve_run_as, warn_if_shared

pytestmark = pytest.mark.integration

PROBE = """
import json, os, sys
out = {"uid": os.getuid(), "saved": os.getresuid()[2], "gid": os.getgid(), "groups": sorted({os.getgid(), *os.getgroups()})}
for name in sys.argv[1:]:
    try:
        open(name).read()
        out[name] = "read"
    except PermissionError:
        out[name] = "denied"
for var in ("MICROCO_CONTROL_DIR", "MICROCO_CHECKPOINT_DIR", "HOME"):
    path = os.path.join(os.environ[var], "probe")
    with open(path, "w") as f:
        f.write("x")
    out[var] = "written"
print("PROBE", json.dumps(out))
"""
# The same probe by exec, in sh: here the platform's interpreter lies under /root (0700), which
# the job user may not enter (an agent in ``auto`` then keeps jobs as itself, saying why).
SH_PROBE = """
r() { if cat "$1" >/dev/null 2>&1; then echo read; else echo denied; fi; }
w() { if echo x > "$1/probe" 2>/dev/null; then echo written; else echo failed; fi; }
printf 'PROBE {"uid": %s, "saved": %s, "gid": %s, "groups": [%s], "%s": "%s", "%s": "%s", "MICROCO_CONTROL_DIR": \
"%s", "MICROCO_CHECKPOINT_DIR": "%s", "HOME": "%s"}\n' "$(id -u)" "$(awk '/^Uid:/ {print $4}' /proc/self/status)" \
"$(id -g)" "$(id -G | tr ' ' ,)" \
"$1" "$(r "$1")" "$2" "$(r "$2")" "$(w "$MICROCO_CONTROL_DIR")" "$(w "$MICROCO_CHECKPOINT_DIR")" "$(w "$HOME")"
"""


def test_the_job_user_follows_run_as():
    assert resolve_run_as("self", euid=0) is None
    assert resolve_run_as("auto", euid=1000) is None  # not root: no separation (warned)
    auto = resolve_run_as("auto", euid=0)
    assert auto is not None and auto.uid not in (0, 1000)
    assert resolve_run_as("64001:64002", euid=0) == JobUser(64001, 64002)
    assert resolve_run_as("1000", euid=1000) is None  # itself
    for bad in ("root", "0", "64001:0", "no-such-user-xyz"):
        with pytest.raises(InvalidArgument):
            resolve_run_as(bad, euid=0)
    with pytest.raises(InvalidArgument, match="only an agent running as root"):
        resolve_run_as("64001", euid=1000)


def test_a_directory_the_job_user_may_not_pass_is_named():
    user = JobUser(DEFAULT_JOB_UID, DEFAULT_JOB_UID)
    base = Path(tempfile.mkdtemp(prefix="microco-runas-"))  # (pytest's own root is 0700)
    try:
        base.chmod(0o755)
        closed = base / "closed"
        (closed / "data").mkdir(parents=True)
        closed.chmod(0o700)
        assert blocked(user, [closed / "data" / "agent"], []) == str(closed)
        assert blocked(user, [closed / "data" / "agent"], [closed]) == ""  # the agent opens its own
        assert blocked(user, [base], []) == ""
    finally:
        shutil.rmtree(base)


def test_an_agent_not_running_as_root_warns_that_jobs_share_its_user(caplog):
    warn_if_shared(None, "/etc/agent.pem")
    assert "JOBS RUN AS THIS AGENT'S OWN USER" in caplog.text and "/etc/agent.pem" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a job as another user")
@pytest.mark.parametrize("zygote", [False, True], ids=["exec", "zygote"])
def test_a_job_cannot_read_the_agents_key(zygote):
    # Not under pytest's 0700 temporary root: the job user must be able to reach its directories.
    base = Path(tempfile.mkdtemp(prefix="microco-runas-"))
    secret = Path(tempfile.mkdtemp(prefix="microco-agent-pki-"))
    user = JobUser(DEFAULT_JOB_UID, DEFAULT_JOB_UID)
    procs = None
    try:
        key = secret / "agent.pem"  # as the stack writes it: 0600 in a 0700 directory
        key.write_text("-----BEGIN PRIVATE KEY-----\n")
        key.chmod(0o600)
        inside = base / "agent-state.json"  # a file of the agent's next to the jobs' directories
        inside.write_text("{}")
        inside.chmod(0o600)
        script = base / "probe.py"
        script.write_text(PROBE)
        script.chmod(0o644)
        procs = ProcessManager(
            base,
            discover_devices("n", 1),
            pin_cpus=False,
            preload=["json"] if zygote else None,
            run_as=user,
        )
        if zygote:
            wait_until(procs.zygote.ready.is_set, 60, "the zygote")
        if zygote:
            command = [sys.executable, str(script), str(key), str(inside)]
        else:
            command = ["/bin/sh", "-c", SH_PROBE, "sh", str(key), str(inside)]
        proc = procs.start("j-1", command, {}, ["n/0"])
        assert proc.forked == zygote
        wait_until(lambda: proc.poll() is not None, 60, "the job to exit")
        text = proc.log_path.read_text()
        assert proc.exit_code == 0, text
        out = json.loads(text.split("PROBE ", 1)[1])
        assert (out["uid"], out["gid"], out["groups"]) == (user.uid, user.gid, [user.gid]), out
        assert out["saved"] == user.uid, out  # no saved root uid to change back to
        assert out[str(key)] == "denied" and out[str(inside)] == "denied", out
        assert {out[v] for v in ("MICROCO_CONTROL_DIR", "MICROCO_CHECKPOINT_DIR", "HOME")} == {"written"}
        # the agent's commands are files the job may read
        proc2 = procs.start("j-2", ["/bin/sh", "-c", "sleep 60"], {}, ["n/0"])
        proc2.control.send("checkpoint")
        assert proc2.control.command_path.stat().st_uid == user.uid
        procs.stop("j-2", grace_s=0.1)
    finally:
        if procs is not None:
            procs.shutdown()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(secret, ignore_errors=True)


PEER_PROBE = """
import json, os, sys
pid, ckpt = int(sys.argv[1]), sys.argv[2]
out = {"uid": os.getuid()}
for name, path in (("environ", f"/proc/{pid}/environ"), ("checkpoint", ckpt)):
    try:
        with open(path, "rb") as f:
            out[name] = f.read().decode(errors="replace")
    except PermissionError:
        out[name] = "denied"
try:
    os.kill(pid, 0)
    out["signal"] = "sent"
except PermissionError:
    out["signal"] = "denied"
print("PROBE", json.dumps(out))
"""
SH_PEER_PROBE = """
printf 'PROBE {"uid": %s, "environ": "%s", "checkpoint": "%s", "signal": "%s"}\\n' "$(id -u)" \
"$(tr '\\0' ' ' < /proc/$1/environ 2>/dev/null | tr -d '"' || echo denied)" \
"$(cat "$2" 2>/dev/null || echo denied)" "$(kill -0 $1 2>/dev/null && echo sent || echo denied)"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a job as another user")
@pytest.mark.parametrize("zygote", [False, True], ids=["exec", "zygote"])
def test_a_job_cannot_read_signal_or_trace_another_job(zygote):
    # Session 40: every job ran as the one job uid, so one user's job read another's
    # environment (its credentials, MICROCO_CREDENTIALS_PEM) through /proc, read its checkpoints
    # and could stop or kill it. Each job now runs as a uid of its own.
    base = Path(tempfile.mkdtemp(prefix="microco-runas-"))
    procs = None
    try:
        base.chmod(0o755)
        script = base / "probe.py"
        script.write_text(PEER_PROBE)
        script.chmod(0o644)
        user = resolve_run_as("auto", euid=0)
        assert user is not None and user.per_job
        procs = ProcessManager(
            base, discover_devices("n", 2), pin_cpus=False, preload=["json"] if zygote else None, run_as=user
        )
        if zygote:
            wait_until(procs.zygote.ready.is_set, 60, "the zygote")
        victim = procs.start(
            "alice-1",
            ["/bin/sh", "-c", 'echo alice-weights > "$MICROCO_CHECKPOINT_DIR/ckpt"; exec sleep 60'],
            {"MICROCO_CREDENTIALS_PEM": "alice-job-key"},
            ["n/0"],
        )
        ckpt = victim.checkpoint_dir / "ckpt"
        wait_until(
            ckpt.exists,
            30,
            "the victim's checkpoint",
            describe=lambda: f"exit {victim.poll()}, log {victim.log_path.read_text()!r}",
        )
        if zygote:
            command = [sys.executable, str(script), str(victim.pid), str(ckpt)]
        else:
            command = ["/bin/sh", "-c", SH_PEER_PROBE, "sh", str(victim.pid), str(ckpt)]
        thief = procs.start("bob-1", command, {}, ["n/1"])
        assert thief.forked == zygote
        wait_until(lambda: thief.poll() is not None, 60, "the probe to exit")
        text = thief.log_path.read_text()
        out = json.loads(text.split("PROBE ", 1)[1])
        assert out["uid"] not in (0, victim.uid) and victim.uid is not None, out
        assert "alice-job-key" not in out["environ"] and out["checkpoint"] == "denied", out
        assert out["signal"] == "denied", out
        # Once it has exited, the job's directories are the agent's again (its uid is reused
        # later); a restarted attempt, as another uid, owns its checkpoint again.
        procs.stop("alice-1", grace_s=0.1)
        assert victim.checkpoint_dir.stat().st_uid == os.geteuid() and ckpt.stat().st_uid == os.geteuid()
        again = procs.start(
            "alice-1", ["/bin/sh", "-c", 'cat "$MICROCO_CHECKPOINT_DIR/ckpt"'], {}, ["n/0"], attempt=1
        )
        wait_until(lambda: again.poll() is not None, 60, "the restarted attempt")
        assert again.exit_code == 0 and "alice-weights" in again.log_path.read_text()
    finally:
        if procs is not None:
            procs.shutdown()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a job as another user")
@pytest.mark.parametrize("zygote", [False, True], ids=["exec", "zygote"])
def test_a_job_cannot_work_in_a_directory_its_user_may_not_reach(zygote):
    """A job started by exec was put in its working directory by the agent, as root, before its
    user changed: a directory under one the job user may not pass (a 0700 home) was open to it
    all the same, its readable files read by name (session 42). Such a workdir is refused, by
    exec and from the zygote alike, naming the directory."""
    base = Path(tempfile.mkdtemp(prefix="microco-runas-"))
    private = Path(tempfile.mkdtemp(prefix="microco-private-"))  # 0700, as /root
    shared = Path(tempfile.mkdtemp(prefix="microco-shared-"))
    procs = None
    try:
        inside = private / "open"  # itself open to all: only the directory above keeps it private
        for d, text in ((inside, "private notes\n"), (shared, "shared notes\n")):
            d.mkdir(exist_ok=True)
            d.chmod(0o755)
            (d / "notes.txt").write_text(text)
            (d / "notes.txt").chmod(0o644)
        script = shared / "probe.py"
        script.write_text("print(open('notes.txt').read())\n")
        script.chmod(0o644)
        procs = ProcessManager(
            base,
            discover_devices("n", 1),
            pin_cpus=False,
            preload=["json"] if zygote else None,
            run_as=JobUser(DEFAULT_JOB_UID, DEFAULT_JOB_UID, per_job=True),
        )
        if zygote:
            wait_until(procs.zygote.ready.is_set, 60, "the zygote")
        command = [sys.executable, str(script)] if zygote else ["/bin/sh", "-c", "cat notes.txt"]
        with pytest.raises(InvalidArgument, match=f"may not pass {private}"):
            procs.start("j-1", command, {}, ["n/0"], workdir=str(inside))
        # a directory the job user reaches is its working directory as before
        proc = procs.start("j-2", command, {}, ["n/0"], workdir=str(shared))
        assert proc.forked == zygote
        wait_until(lambda: proc.poll() is not None, 60, "the job to exit")
        assert "shared notes" in proc.log_path.read_text()
    finally:
        if procs is not None:
            procs.shutdown()
        for d in (base, private, shared):
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a job as another user")
def test_jobs_as_their_own_users_start_while_the_agents_grpc_is_busy():
    """CI, session 43: a job as its own uid never ran its first line (the victim's checkpoint of
    ``test_a_job_cannot_read_signal_or_trace_another_job`` never came). The agent is a gRPC
    server; a job whose user changed was started by ``fork`` (Python's ``vfork`` is for children
    that change nothing), which runs gRPC's fork handlers in the child, and with calls in flight
    on other threads a child aborted or crashed in them before its ``exec`` (about one start in
    ten here: "Check failed: next_worker->state == KICKED", exit -6 or -11). setpriv now changes
    the user, after ``exec``."""
    from concurrent import futures

    import grpc

    base = Path(tempfile.mkdtemp(prefix="microco-runas-"))
    server = grpc.server(futures.ThreadPoolExecutor(4))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    busy = True

    def calls() -> None:  # the agent's serving threads, busy in gRPC while a job starts
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/microco.Test/Unknown")
            while busy:
                try:
                    call(b"", timeout=1)
                except grpc.RpcError:
                    pass

    threads = [threading.Thread(target=calls, daemon=True) for _ in range(2)]
    procs = None
    try:
        base.chmod(0o755)
        for t in threads:
            t.start()
        procs = ProcessManager(
            base, discover_devices("n", 1), pin_cpus=False, run_as=resolve_run_as("auto", 0)
        )
        for i in range(60):
            proc = procs.start(
                f"j-{i}", ["/bin/sh", "-c", 'echo ran > "$MICROCO_CHECKPOINT_DIR/ran"'], {}, ["n/0"]
            )
            wait_until(lambda p=proc: p.poll() is not None, 60, f"job {i} to exit")
            assert proc.exit_code == 0 and (proc.checkpoint_dir / "ran").exists(), (i, proc.exit_code)
    finally:
        busy = False
        for t in threads:
            t.join(timeout=10)
        server.stop(None)
        if procs is not None:
            procs.shutdown()
        shutil.rmtree(base, ignore_errors=True)
