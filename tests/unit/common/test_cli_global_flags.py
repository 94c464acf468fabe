"""Every global flag (and a command group's own flags) is accepted wherever a user types it:
before the command, after the group, after the subcommand, after its positional arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from microco.cli import build_parser, main


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--home", "H", "job", "logs", "j1"],
        ["job", "--home", "H", "logs", "j1"],
        ["job", "logs", "--home", "H", "j1"],
        ["job", "logs", "j1", "--home", "H"],
        ["job", "logs", "-f", "--home=H", "--tail", "5", "j1"],
    ],
    ids=" ".join,
)
def test_job_logs_home_anywhere(argv: list[str]) -> None:
    args = _parse(argv)
    assert args.home == Path("H") and args.job_id == "j1" and args.func.__name__ == "cmd_logs"


@pytest.mark.parametrize(
    "argv",
    [
        ["--etcd", "e:1", "status"],
        ["status", "--etcd", "e:1"],
        ["--etcd", "e:1", "store", "tables"],
        ["store", "tables", "--etcd", "e:1"],
        ["cache", "datasets", "--etcd", "e:1"],
        ["compiler", "graphs", "--etcd", "e:1"],
        ["console", "open", "--etcd", "e:1"],
        ["--etcd", "e:1", "console", "open"],
        ["job", "submit", "--etcd", "e:1", "--", "python", "x.py"],
    ],
    ids=" ".join,
)
def test_etcd_anywhere(argv: list[str]) -> None:
    assert _parse(argv).etcd == "e:1"


def test_defaults_when_not_given() -> None:
    for argv in (["job", "list"], ["status"], ["store", "tables"], ["up"], ["down"]):
        args = _parse(argv)
        assert args.home is None and args.etcd == "", argv


def test_a_groups_own_flags_reach_its_subcommands() -> None:
    assert _parse(["job", "--timeout", "3", "logs", "j"]).timeout == 3.0
    assert _parse(["job", "logs", "--timeout", "3", "j"]).timeout == 3.0
    assert _parse(["job", "logs", "j"]).timeout == 10.0
    assert _parse(["store", "recovery", "--coordinator", "c:1"]).coordinator == "c:1"
    assert _parse(["store", "--coordinator", "c:1", "recovery"]).coordinator == "c:1"


def test_the_job_command_keeps_its_own_flags() -> None:
    # after `--` everything is the job's, even a flag that is also a global one
    args = _parse(["job", "submit", "--home", "H", "--", "python", "t.py", "--home", "mine"])
    assert args.home == Path("H") and args.cmd[-2:] == ["--home", "mine"]


def test_up_keeps_its_meaning_of_etcd_and_timeout() -> None:
    args = _parse(["up", "--etcd", "e:1", "--timeout", "30"])
    assert args.etcd == "e:1" and args.timeout == 30.0
    assert _parse(["up"]).timeout == 120.0


def test_job_logs_with_home_after_the_subcommand_is_not_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    # what a user hit: `microco job logs --home X ID` was an argparse error ("unrecognized
    # arguments"); now it runs and fails only for want of a platform at that home
    monkeypatch.delenv("MICROCO_ETCD", raising=False)
    assert main(["job", "logs", "--home", str(tmp_path), "some-job"]) == 1
    err = capsys.readouterr().err
    assert "no etcd to read from" in err and str(tmp_path / "stack.json") in err
