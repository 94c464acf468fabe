"""`microco up` as a user runs it: every service comes up healthy (seen through etcd and the gRPC
health protocol), `microco status` agrees, and Ctrl-C or `microco down` leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _support import scaled, small_stack

from microco.common.discovery import pid_alive
from microco.services.stack import StackOptions, platform_processes

pytestmark = pytest.mark.e2e

MICROCO = [sys.executable, "-m", "microco.cli"]


def wait_for_state(home: Path, proc: subprocess.Popen, timeout: float = 150) -> dict:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"microco up exited early:\n{proc.stderr.read().decode()}")
        path = home / "stack.json"
        if path.exists():
            state = json.loads(path.read_text())
            statuses = [p.get("status") for p in state["processes"] if p["name"] not in ("etcd", "redis")]
            if statuses and all(s in ("healthy", "absent") for s in statuses):
                return state
        time.sleep(0.3)
    raise AssertionError("stack did not become healthy")


def assert_nothing_left(pids: list[int], home: Path) -> None:
    """Every process of the stack has exited (waited for up to 60 s) and its state file is gone."""
    deadline = time.monotonic() + 60
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if pid_alive(pid)]
    assert not (home / "stack.json").exists()


def stop_leftovers(up: subprocess.Popen, home: Path) -> None:
    """After a failed test: stop `microco up` and whatever a failed stop left running."""
    if up.poll() is None:
        up.kill()
    if (home / "stack.json").exists():
        subprocess.run([*MICROCO, "down", "--home", str(home)], capture_output=True, timeout=60, check=False)


def expected_services() -> list[str]:
    return [s.name for s in platform_processes(StackOptions(console_port=0, store_nodes=3)) if s.available()]


def assert_console_token_is_the_stacks_own(state: dict, home: Path) -> None:
    """The stack's console refuses the well-known development token (any local user, and any
    job, reaches it on loopback) and takes the token `microco console token` prints (session 40)."""

    from microco.services.console import DEFAULT_DEV_TOKEN

    address = next((p.get("address") for p in state["processes"] if p["name"] == "console"), None)
    if not address:
        return  # not part of this build
    token = subprocess.run(
        [*MICROCO, "console", "token", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "MICROCO_CONSOLE_TOKEN"},
    ).stdout.strip()

    def whoami(tok: str) -> int:
        req = urllib.request.Request(
            f"http://{address}/api/v1/whoami", headers={"Authorization": f"Bearer {tok}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert token != DEFAULT_DEV_TOKEN
    assert whoami(DEFAULT_DEV_TOKEN) == 401
    assert whoami(token) == 200


def test_up_status_and_ctrl_c_leave_nothing_behind(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = subprocess.Popen(
        [*MICROCO, "up", "--home", str(home), "--console-port", "0", "--devices", "2", "--store-nodes", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # started as a script's background `&` starts it (SIGINT ignored): Ctrl-C still stops it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        state = wait_for_state(home, up)
        healthy = {p["name"] for p in state["processes"] if p.get("status") == "healthy"}
        assert healthy == set(expected_services())
        # Every service registered and serving. On a loaded machine a check can land while a
        # service's registration is being renewed or its answer is late: `status` is asked again
        # (it must come clean within the bound), and what was not serving is shown if it never does.
        deadline = time.monotonic() + 60
        while True:
            status = subprocess.run(
                [*MICROCO, "status", "--home", str(home), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                # A password for some other Redis in the environment (the suite's own sets one):
                # the stack's Redis is checked with the stack's password all the same.
                env={**os.environ, "MICROCO_REDIS_PASSWORD": "another-redis"},
            )
            rows = json.loads(status.stdout)["services"]
            bad = [r for r in rows if r["health"] != "SERVING"]
            if not bad or time.monotonic() > deadline:
                break
            time.sleep(1)
        registered = {r["instance"] for r in rows}
        for p in state["processes"]:
            if p.get("status") == "healthy":
                assert any(i.startswith(p["name"] + "-") for i in registered), p["name"]
        assert not bad, (bad, status.stderr)
        assert status.returncode == (0 if rows else 1)
        pids = [p["pid"] for p in state["processes"] if p.get("pid")]
        assert pids and all(pid_alive(pid) for pid in pids)
        assert_console_token_is_the_stacks_own(state, home)
        up.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert up.wait(60) == 0
        assert_nothing_left(pids, home)
    finally:
        stop_leftovers(up, home)


def test_a_second_ctrl_c_while_stopping_still_leaves_nothing_behind(tmp_path: Path) -> None:
    # An impatient user presses Ctrl-C again while the services are being stopped: what is left
    # is killed at once instead of etcd and Redis (each in its own session) being orphaned.
    home = tmp_path / "home"
    up = subprocess.Popen(
        small_stack(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        state = wait_for_state(home, up)
        pids = [p["pid"] for p in state["processes"] if p.get("pid")]
        assert {"etcd", "redis"} <= {p["name"] for p in state["processes"] if p.get("pid")}
        said = []
        for line in up.stderr:  # running (the state file says healthy a little before that)
            said.append(line)
            if "Ctrl-C to stop" in line:
                break
        up.send_signal(signal.SIGINT)
        for line in up.stderr:
            said.append(line)
            if "stopping" in line:
                break
        up.send_signal(signal.SIGINT)  # while the services are given their grace to stop
        rest = up.stderr.read()
        assert up.wait(60) == 0, "".join(said) + rest
        assert "stopping at once" in rest and "interrupted" not in rest, rest
        assert_nothing_left(pids, home)
    finally:
        stop_leftovers(up, home)


def test_ctrl_c_while_the_stack_starts_stops_it_like_any_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C as soon as the state file is written (services starting): the stack stops what it
    started, says so, and exits 0, as a Ctrl-C while running does. Before, a Ctrl-C in the start
    (also between the state file's last "healthy" and the start's end, which a busy CI host hit)
    ended with "interrupted" and exit 130, without "stopping"."""
    home = tmp_path / "home"
    up = subprocess.Popen(small_stack(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 150
        while not (home / "stack.json").exists() and up.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        state = json.loads((home / "stack.json").read_text())
        pids = [p["pid"] for p in state["processes"] if p.get("pid")]
        up.send_signal(signal.SIGINT)
        out = up.stderr.read()
        assert up.wait(60) == 0, out
        assert "stopping" in out and "interrupted" not in out, out
        assert_nothing_left(pids, home)
    finally:
        stop_leftovers(up, home)


def test_status_without_etcd_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MICROCO_ETCD"}
    out = subprocess.run(
        [*MICROCO, "status", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 1
    assert "no etcd to read from" in out.stderr and "Traceback" not in out.stderr
