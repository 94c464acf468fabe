"""``microco job`` parses as documented and refuses bad input before calling anything."""

from __future__ import annotations

import pytest

from microco.cli import build_parser, main


def test_job_commands_parse():
    p = build_parser()
    a = p.parse_args(
        ["job", "submit", "--devices", "2", "--name", "x", "--", "python", "-m", "m", "--steps", "3"]
    )
    assert a.devices == 2 and a.cmd[-4:] == ["python", "-m", "m", "--steps", "3"][-4:]
    assert p.parse_args(["job", "list", "--state", "running"]).state == ["running"]
    assert p.parse_args(["job", "cancel", "a", "b"]).job_id == ["a", "b"]


def test_submit_without_command_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("MICROCO_ETCD", "127.0.0.1:1")
    assert main(["job", "submit", "--devices", "1"]) == 1
    assert "give the job's command" in capsys.readouterr().err


def test_bad_state_is_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["job", "list", "--state", "sleeping"])


def test_operator_commands_parse_and_resize_needs_one_target(capsys, monkeypatch):
    p = build_parser()
    a = p.parse_args(["job", "migrate", "j1", "--devices", "n2/0,n2/1"])
    assert (a.action, a.job_id, a.devices) == ("migrate", "j1", "n2/0,n2/1")
    assert p.parse_args(["job", "resize", "j1", "3"]).count == 3
    assert p.parse_args(["job", "suspend", "j1"]).action == "suspend"
    monkeypatch.setenv("MICROCO_ETCD", "127.0.0.1:1")
    assert main(["job", "resize", "j1"]) == 1
    assert "give either a device count or --devices" in capsys.readouterr().err
    assert main(["job", "resize", "j1", "2", "--devices", "n1/0"]) == 1
