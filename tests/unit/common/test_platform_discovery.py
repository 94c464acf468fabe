"""Clients find the platform one way everywhere: explicit argument, else MICROCO_ETCD /
MICROCO_REDIS, else the local stack's state file (stack.json under --home, MICROCO_HOME,
~/.microco) while one of its processes lives; otherwise an error naming each source tried."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from microco.common import PlatformNotFound, find_etcd, find_redis, stack_home
from microco.common.errors import FailedPrecondition


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("MICROCO_ETCD", "MICROCO_REDIS", "MICROCO_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # no developer's ~/.microco


def _stack(
    home: Path, pid: int = os.getpid(), etcd: str = "127.0.0.1:4001", redis: str = "redis://h:1/0"
) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "stack.json").write_text(
        json.dumps({"etcd": etcd, "redis": redis, "processes": [{"name": "etcd", "pid": pid}]})
    )
    return home


def test_argument_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MICROCO_ETCD", "env:1")
    home = _stack(tmp_path / "h")
    found = find_etcd("arg:1", home)
    assert (found.address, found.source) == ("arg:1", "argument")


def test_environment_before_the_state_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MICROCO_ETCD", "env:1")
    monkeypatch.setenv("MICROCO_REDIS", "redis://env:2/0")
    home = _stack(tmp_path / "h")
    assert find_etcd(None, home).source == "MICROCO_ETCD" and find_etcd(None, home).address == "env:1"
    assert find_redis("", home).address == "redis://env:2/0"


def test_the_local_stack_last(tmp_path: Path) -> None:
    home = _stack(tmp_path / "h")
    found = find_etcd(home=home)
    assert found.address == "127.0.0.1:4001" and found.source == str(home / "stack.json")
    assert find_redis(home=home).address == "redis://h:1/0"


def test_home_from_microco_home_then_user_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert stack_home() == tmp_path / "user" / ".microco"
    _stack(tmp_path / "user" / ".microco", etcd="default:1")
    assert find_etcd().address == "default:1"
    monkeypatch.setenv("MICROCO_HOME", str(_stack(tmp_path / "other", etcd="other:1")))
    assert stack_home() == tmp_path / "other" and find_etcd().address == "other:1"


def test_nothing_found_names_each_source(tmp_path: Path) -> None:
    with pytest.raises(PlatformNotFound) as exc:
        find_etcd(home=tmp_path / "nowhere")
    msg = str(exc.value)
    assert isinstance(exc.value, FailedPrecondition)  # the CLI prints it without a traceback
    assert "no etcd to read from" in msg
    assert "--etcd (not given)" in msg and "MICROCO_ETCD (not set)" in msg
    assert str(tmp_path / "nowhere" / "stack.json") in msg and "absent" in msg
    with pytest.raises(PlatformNotFound, match="MICROCO_REDIS"):
        find_redis(home=tmp_path / "nowhere")


def test_a_stale_state_file_is_not_believed(tmp_path: Path) -> None:
    # a stack that died without `microco down` (a reboot, kill -9) leaves its state file behind
    home = _stack(tmp_path / "h", pid=2**22 + 12345)
    with pytest.raises(PlatformNotFound, match="stale"):
        find_etcd(home=home)


def test_an_unreadable_state_file_is_named(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "stack.json").write_text("{not json")
    with pytest.raises(PlatformNotFound, match="unreadable"):
        find_etcd(home=home)


def test_typed_clients_discover_when_given_no_etcd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # every typed client's from_etcd() and the cache loader go through the same rule: with no
    # platform anywhere each says so, naming what it tried, before dialling anything
    from microco.clients.cache import open_loader
    from microco.clients.compiler import RemoteExplorer
    from microco.clients.scheduler import SchedulerClient
    from microco.clients.store import StoreClient

    monkeypatch.setenv("MICROCO_HOME", str(tmp_path / "none"))
    for make in (
        SchedulerClient.from_etcd,
        StoreClient.from_etcd,
        RemoteExplorer.from_etcd,
        lambda: open_loader(None, "digits", batch_size=8, job_id="j"),
    ):
        with pytest.raises(PlatformNotFound, match="MICROCO_ETCD"):
            make()


def test_a_process_reaped_between_the_check_and_the_read_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """kill(0) can succeed and the /proc read then fail with ESRCH when the process is reaped in
    between (CI, stop 36): that is a process gone, not an error and not one alive."""
    import builtins

    from microco.common.discovery import pid_alive

    real_open = builtins.open

    class _Reaped:
        def __enter__(self) -> _Reaped:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self) -> str:
            raise ProcessLookupError(3, "No such process")

    def fake_open(path: object, *args: object, **kwargs: object) -> object:
        if str(path) == f"/proc/{os.getpid()}/stat":
            return _Reaped()
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    assert pid_alive(os.getpid())
    monkeypatch.setattr(builtins, "open", fake_open)
    assert not pid_alive(os.getpid())
