"""A self-healing local stack (issue 16): `microco up` restarts a service killed with SIGKILL (it
is registered and SERVING again within 10 s), a killed scheduler leader hands over to the
standby, `microco status` is truthful (non-zero and naming the culprit while a service is
paused or gone, leaders marked), and a detached stack is supervised too."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import small_stack, wait_until
from test_stack import pid_alive, stop_leftovers, wait_for_state

from microco.cli import main as cli_main
from microco.common.health import check_health
from microco.common.kv import EtcdKV
from microco.common.registry import SERVICES_PREFIX, ServiceRecord

pytestmark = pytest.mark.e2e

MICROCO = [sys.executable, "-m", "microco.cli"]
# issue 16's target is 10 s (measured: docs/faults.md); the bound here holds on a loaded machine.
RECOVERY_S = 60.0


class Up:
    def __init__(self, home: Path, proc: subprocess.Popen, log: Path) -> None:
        self.home, self.proc, self.log = home, proc, log
        self.state = wait_for_state(home, proc)

    def read_state(self) -> dict:
        return json.loads((self.home / "stack.json").read_text())

    def process(self, name: str) -> dict:
        return next(p for p in self.read_state()["processes"] if p["name"] == name)

    def status(self) -> tuple[int, dict]:
        """`microco status --json`, run in this process (a fresh interpreter per probe would
        add seconds of start-up to every measurement)."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(["status", "--home", str(self.home), "--json"])
        try:
            return code, json.loads(out.getvalue())
        except ValueError:  # no etcd to read from: the error is on stderr
            return code, {"services": [], "problems": [err.getvalue().strip()]}

    def said(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    home = tmp_path_factory.mktemp("selfheal") / "home"
    log = home.parent / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            small_stack(home),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Up(home, proc, log)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        stop_leftovers(proc, home)


def restarted_and_serving(up: Up, name: str, service: str, old_pid: int) -> ServiceRecord | None:
    """The record of ``name``'s new process once it is registered and SERVING."""
    p = up.process(name)
    if p["pid"] == old_pid or not pid_alive(p["pid"]):
        return None
    kv = EtcdKV(up.state["etcd"])
    try:
        raw = kv.get(f"{SERVICES_PREFIX}{service}/{p['instance_id']}")
    finally:
        kv.close()
    if raw is None:
        return None
    rec = ServiceRecord.from_json(raw)
    return rec if check_health(rec, timeout=1.0) == "SERVING" else None


def test_a_killed_service_is_restarted_and_serving_again(up: Up) -> None:
    cache = up.process("cache")
    os.kill(cache["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    rec = wait_until(
        lambda: restarted_and_serving(up, "cache", "cache", cache["pid"]),
        RECOVERY_S,
        "the cache is registered and SERVING again",
    )
    print(f"cache back in {time.monotonic() - t0:.1f}s at {rec.address}")
    said = up.said()
    assert "cache exited with code -9; restarting in" in said, said
    wait_until(
        lambda: "cache: healthy again" in up.said(), RECOVERY_S, "the supervisor says the cache is back"
    )
    wait_until(lambda: up.status()[0] == 0, 30, "status is clean again")


def test_status_names_a_paused_service_and_never_drops_it(up: Up) -> None:
    compiler = up.process("compiler")
    os.kill(compiler["pid"], signal.SIGSTOP)
    try:
        code, out = up.status()
        assert code == 1
        assert any(compiler["instance_id"] in p for p in out["problems"]), out["problems"]

        # Past its lease the registration vanishes from etcd; status still lists it, as MISSING.
        def missing() -> dict | None:
            code, out = up.status()
            rows = [r for r in out["services"] if r["instance"] == compiler["instance_id"]]
            return out if code == 1 and rows and rows[0]["health"].startswith("MISSING") else None

        wait_until(missing, 30, "the paused compiler is listed as MISSING")
    finally:
        os.kill(compiler["pid"], signal.SIGCONT)
    wait_until(lambda: up.status()[0] == 0, 30, "status is clean once the compiler resumes")


def test_killing_the_leader_hands_over_to_the_standby(up: Up) -> None:
    code, out = up.status()
    schedulers = [r for r in out["services"] if r["service"] == "scheduler"]
    assert sorted(r["role"] for r in schedulers) == ["leader", "standby"], schedulers
    leader = next(r for r in schedulers if r["role"] == "leader")
    standby = next(r for r in schedulers if r["role"] == "standby")
    name = leader["instance"].rsplit("-", 1)[0]
    os.kill(up.process(name)["pid"], signal.SIGKILL)
    t0 = time.monotonic()

    def handed_over() -> bool:
        _, out = up.status()
        return any(
            r["instance"] == standby["instance"] and r["role"] == "leader" and r["health"] == "SERVING"
            for r in out["services"]
        )

    wait_until(handed_over, 30, "the standby leads")
    print(f"standby leads {time.monotonic() - t0:.1f}s after the kill")
    # The killed one comes back, as the standby now.
    wait_until(lambda: up.status()[0] == 0, RECOVERY_S, "status is clean again")

    def roles() -> dict[str, str]:
        _, out = up.status()
        return {r["instance"]: r["role"] for r in out["services"] if r["service"] == "scheduler"}

    # The restarted instance registers first and takes its place in the election just after.
    restarted = up.process(name)["instance_id"]
    want = {standby["instance"]: "leader", restarted: "standby"}
    wait_until(lambda: roles() == want, RECOVERY_S, f"the restarted scheduler stands by ({want})")


@pytest.mark.slow  # starts a stack of its own (~20-30 s on a busy 2-core machine)
def test_a_detached_stack_is_supervised_and_down_stops_everything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = subprocess.run(
        small_stack(home, "--no-standby", "--detach"),
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        assert "restarts crashed services" in up.stderr
        state = json.loads((home / "stack.json").read_text())
        supervisor = state["supervisor_pid"]
        assert pid_alive(supervisor)
        assert all(pid_alive(p["pid"]) for p in state["processes"] if p.get("pid"))
        again = subprocess.run(
            [*MICROCO, "up", "--home", str(home), "--detach"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert again.returncode == 1 and "microco down" in again.stderr  # one stack per home
        agent = next(p for p in state["processes"] if p["name"] == "agent")
        os.kill(agent["pid"], signal.SIGKILL)

        def agent_back() -> bool:
            p = next(
                p for p in json.loads((home / "stack.json").read_text())["processes"] if p["name"] == "agent"
            )
            return p["pid"] != agent["pid"] and p["status"] == "healthy"

        wait_until(agent_back, RECOVERY_S, "the agent of a detached stack is restarted and healthy")
        pids = [p["pid"] for p in json.loads((home / "stack.json").read_text())["processes"] if p.get("pid")]
        down = subprocess.run(
            [*MICROCO, "down", "--home", str(home)], capture_output=True, text=True, timeout=90, check=False
        )
        assert down.returncode == 0, down.stderr
        assert not [pid for pid in [*pids, supervisor] if pid_alive(pid)]
        said = (home / "logs" / "supervisor.log").read_text()
        assert "agent exited with code -9; restarting in" in said
        assert said.count("agent: restarted") == 1, said  # nothing restarted during the stop
        none = subprocess.run(
            [*MICROCO, "down", "--home", str(home)], capture_output=True, text=True, timeout=60, check=False
        )
        assert none.returncode == 1 and "no running stack" in none.stderr
    finally:
        if (home / "stack.json").exists():
            subprocess.run(
                [*MICROCO, "down", "--home", str(home)], capture_output=True, timeout=60, check=False
            )
