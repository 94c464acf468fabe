"""What the CLI prints for people: numbers rounded for reading in every table (one formatter),
`store recovery` as a table like every other command (JSON only with --json), and `microco
down` saying how many processes stopped even when a foreground `microco up` stopped them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from microco.cli import _format, main
from microco.cli._platform import print_table


@pytest.mark.parametrize(
    "value,text",
    [
        (6331.549999999999, "6331.55"),
        (0.1 + 0.2, "0.3"),
        (3.0, "3"),
        (12.5, "12.5"),
        (-2.5, "-2.5"),
        (0.000123456, "0.000123"),
        (0.0, "0"),
        (42, "42"),
        (10**16 + 0.5, "1e+16"),
        (float("nan"), "-"),
        (None, "-"),
        (True, "yes"),
        (["a", 1.25], "a,1.25"),
    ],
)
def test_cells_for_people(value: Any, text: str) -> None:
    assert _format.cell(value) == text


def test_tables_print_rounded_numbers(capsys) -> None:
    print_table([{"day": 1, "revenue": 6331.549999999999}, {"day": 2, "revenue": 0.1 + 0.2}])
    out = capsys.readouterr().out
    assert "6331.549999999999" not in out and "0.30000000000000004" not in out
    assert out.splitlines() == ["DAY  REVENUE", "  1  6331.55", "  2      0.3"]  # numbers right-aligned


@pytest.mark.parametrize(
    "value,text",
    [(200_000, "200,000"), (999, "999"), (-1234567, "-1,234,567"), (1234.5678, "1,234.57"), (None, "-")],
)
def test_counts_are_grouped_in_thousands(value: Any, text: str) -> None:
    assert _format.count(value) == text


class _FakeTables:
    def __enter__(self) -> _FakeTables:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list_tables(self) -> list[dict[str, Any]]:
        replicas = [
            {"column": "trip_id", "kind": "hash", "codec": "zstd"},
            {"column": "city", "kind": "hash", "codec": "lz4"},
        ]
        return [
            {"name": "trips", "rows": 200_000, "bytes": 7_340_032, "extents": 48, "unavailable_extents": 0,
             "replicas": replicas},
            {"name": "riders", "rows": 5_000, "bytes": 81_920, "extents": 1_200, "unavailable_extents": 12,
             "replicas": replicas},
        ]  # fmt: skip

    def nodes(self) -> list[dict[str, Any]]:
        return [
            {"name": "store-node-1", "alive": True, "fault_domain": "fd-1", "extents": 1_234, "bytes": 2_097_152,
             "address": "127.0.0.1:4001"},
            {"name": "store-node-2", "alive": False, "fault_domain": "fd-2", "extents": 7, "bytes": 512,
             "address": "127.0.0.1:4002"},
        ]  # fmt: skip


def test_store_tables_group_counts_and_show_bytes_in_units(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from microco.cli import store

    monkeypatch.setattr(store, "_client", lambda args: _FakeTables())
    assert main(["store", "tables", "--coordinator", "x:1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "ROWS", "BYTES", "EXTENTS", "UNAVAILABLE", "REPLICAS"]
    assert "200,000" in lines[1] and "7.0 MiB" in lines[1] and "1,200" in lines[2] and "80.0 KiB" in lines[2]
    # right-aligned: every number ends where its header ends
    for head in ("ROWS", "BYTES", "EXTENTS", "UNAVAILABLE"):
        end = lines[0].index(head) + len(head)
        assert all(line[end - 1] != " " and line[end] == " " for line in lines[1:]), (head, lines)

    assert main(["store", "nodes", "--coordinator", "x:1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "1,234" in lines[1] and "2.0 MiB" in lines[1] and "512 B" in lines[2]
    assert lines[1].split()[1] == "yes" and lines[2].split()[1] == "no"


def test_sizes() -> None:
    assert _format.size(512) == "512 B" and _format.size(1536) == "1.5 KiB" and _format.size(None) == "-"


class _FakeStore:
    """What StoreClient.recovery() answers (the coordinator's progress record)."""

    def __init__(self, rec: dict[str, Any]) -> None:
        self.rec = rec

    def __enter__(self) -> _FakeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def recovery(self) -> dict[str, Any]:
        return self.rec

    def start_recovery(self) -> dict[str, Any]:
        return self.rec


RECOVERY = {
    "state": "done",
    "lost_extents": 12,
    "rebuilt": 12,
    "bytes_lost": 3_500_000,
    "bytes_read": 7_340_032,
    "full_scan_bytes": 41_000_000,
    "started": 1_700_000_000.25,
    "seconds": 1.2345678901,
    "stuck": [],
    "errors": [],
    "unavailable_extents": 0,
}


def test_store_recovery_prints_a_table(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from microco.cli import store

    monkeypatch.setattr(store, "_client", lambda args: _FakeStore(dict(RECOVERY)))
    assert main(["store", "recovery", "--coordinator", "x:1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "STATE",
        "LOST",
        "REBUILT",
        "UNAVAILABLE",
        "BYTES_LOST",
        "BYTES_READ",
        "SECONDS",
    ]
    assert lines[1].split()[:4] == ["done", "12", "12", "0"] and "1.23" in lines[1] and "7.0 MiB" in lines[1]
    assert "{" not in out


def test_store_recovery_json_on_request(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from microco.cli import store

    monkeypatch.setattr(store, "_client", lambda args: _FakeStore(dict(RECOVERY, stuck=["t/e1"])))
    assert main(["store", "recovery", "--coordinator", "x:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seconds"] == RECOVERY["seconds"]


def test_store_recovery_says_what_is_stuck(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from microco.cli import store

    rec = dict(RECOVERY, state="stuck", stuck=["orders/e7: no live node outside fd-1"], errors=["boom"])
    monkeypatch.setattr(store, "_client", lambda args: _FakeStore(rec))
    assert main(["store", "recovery", "--coordinator", "x:1"]) == 0
    out = capsys.readouterr().out
    assert "stuck: orders/e7: no live node outside fd-1" in out and "error: boom" in out


# -- microco down against a foreground microco up ---------------------------------------

# A stand-in for a foreground `microco up`: its own children, which it stops on SIGTERM (as the
# real supervisor does) before `microco down` gets to them.
SUPERVISOR = textwrap.dedent(
    """
    import json, signal, subprocess, sys, time
    home = sys.argv[1]
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(3)]
    def stop(*_):
        for k in kids:
            k.terminate()
        for k in kids:
            k.wait()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    import os
    state = {"etcd": "x:1", "redis": "redis://x:2/0", "supervisor_pid": os.getpid(),
             "processes": [{"name": f"svc-{i}", "pid": k.pid} for i, k in enumerate(kids)]}
    open(home + "/stack.json", "w").write(json.dumps(state))
    while True:
        time.sleep(1)
    """
)


def test_down_counts_what_a_foreground_up_stopped(tmp_path: Path, capsys) -> None:
    up = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "stack.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        state = json.loads((tmp_path / "stack.json").read_text())
        assert main(["down", "--home", str(tmp_path)]) == 0
        err = capsys.readouterr().err
        assert "stopped 3 processes" in err, err
        assert up.wait(10) == 0
        for p in state["processes"]:
            with pytest.raises(ProcessLookupError):
                os.kill(p["pid"], 0)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGKILL)
            up.wait()


def test_console_port_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from microco.cli._platform import _console_port
    from microco.common.errors import InvalidArgument

    monkeypatch.delenv("MICROCO_CONSOLE_PORT", raising=False)
    assert _console_port(None) == 8080
    monkeypatch.setenv("MICROCO_CONSOLE_PORT", "18083")
    assert _console_port(None) == 18083 and _console_port(0) == 0  # the flag wins
    monkeypatch.setenv("MICROCO_CONSOLE_PORT", "eighty")
    with pytest.raises(InvalidArgument, match="MICROCO_CONSOLE_PORT"):
        _console_port(None)
