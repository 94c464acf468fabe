"""Every command line of the platform explains itself (session 41's held-out round): each
subcommand of ``microco`` and each argument of it and of every service's ``python -m`` entry
point carries a help text, and the store's entry point says how to run a store node (its
``--help`` named only the coordinator's flags; the node's were found by reading the source).
Before: 37 arguments of ``microco`` had none (``job show``'s JOB_ID, ``--json`` of eleven
commands, ``store query --limit``/``--format``, ``store recovery --start``...)."""

from __future__ import annotations

import argparse
import runpy
import sys
from typing import Any

import pytest

SERVICES = [
    ("microco.services.agent", []),
    ("microco.services.cache", []),
    ("microco.services.compiler", []),
    ("microco.services.console", []),
    ("microco.services.scheduler", []),
    ("microco.services.store", []),
    ("microco.services.store", ["node"]),
    ("microco.services.stack", []),
]


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _unexplained(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    missing.append(f"{path} {name}: a subcommand without help")
                missing += _unexplained(sub, f"{path} {name}")
            continue
        if not action.help:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_microco_command_and_argument_has_help():
    from microco.cli import build_parser

    assert _unexplained(build_parser(), "microco") == []


def _service_parser(module: str, argv: list[str], monkeypatch: Any) -> argparse.ArgumentParser:
    def caught(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    monkeypatch.setattr(sys, "argv", [f"python -m {module}", *argv])
    with pytest.raises(_Parsed) as info:  # as `python -m MODULE ARGV` runs it
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    return info.value.parser


@pytest.mark.parametrize(("module", "argv"), SERVICES, ids=[" ".join([m, *a]) for m, a in SERVICES])
def test_every_service_entry_point_explains_its_flags(module, argv, monkeypatch):
    parser = _service_parser(module, argv, monkeypatch)
    assert parser.description, module
    assert _unexplained(parser, " ".join([module, *argv])) == []


def test_the_stores_entry_point_says_how_to_run_a_node(monkeypatch, capsys):
    parser = _service_parser("microco.services.store", [], monkeypatch)
    assert "microco.services.store node" in parser.format_help()
