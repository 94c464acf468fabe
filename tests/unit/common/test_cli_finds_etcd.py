"""Every command that talks to the platform finds etcd the same way (``--etcd``, then
``MICROCO_ETCD``, then the stack ``microco up`` started from ``--home``), and says so plainly
when there is none, instead of failing on an option it does not have."""

from __future__ import annotations

from pathlib import Path

import pytest

from microco.cli import build_parser, main

# each command group that reads etcd, with one of its read-only subcommands
COMMANDS = [
    ["status"],
    ["job", "list"],
    ["job", "show", "some-job"],
    ["cache", "datasets"],
    ["store", "tables"],
    ["compiler", "graphs"],
    ["console", "open", "--no-browser"],
]


def _with_home(cmd: list[str], home: Path) -> list[str]:
    # --home belongs to the group (``microco job --home H list``), or to the command itself
    # where the group has none (status; console open)
    if cmd[0] in ("status", "console"):
        return [*cmd, "--home", str(home)]
    return [cmd[0], "--home", str(home), *cmd[1:]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c))
def test_no_etcd_anywhere_is_a_clear_error(cmd: list[str], tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("MICROCO_ETCD", raising=False)
    assert main(_with_home(cmd, tmp_path)) == 1  # a home with no stack started from it
    err = capsys.readouterr().err
    assert "no etcd to read from" in err and "Traceback" not in err, err


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_takes_etcd_and_home(cmd: list[str], tmp_path: Path) -> None:
    args = build_parser().parse_args(_with_home(cmd, tmp_path))
    assert args.home == tmp_path and args.etcd == ""
