"""Flags accepted wherever a user types them.

``microco --home H job logs ID``, ``microco job --home H logs ID`` and ``microco job logs --home H
ID`` mean the same. The global flags (``--home``, ``--etcd``) are declared once on the top-level
parser; a command group's own flags (``job --timeout``, ``store --coordinator``) on the group.
:func:`share_flags` then gives every parser below a copy of each flag from above it (argparse
``parents`` does the same for one level, at construction; this walks the finished tree, so each
command module stays as it is).

Only the top-level parser, or the group that declares a flag, holds its default: every copy
below defaults to ``SUPPRESS``. argparse copies a subcommand's namespace over its parent's, so
a copy with a real default would undo a value given higher up (``microco --home H job list``
would lose H).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

_NOT_SHARED = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def add_global_flags(parser: argparse.ArgumentParser) -> None:
    """``--home`` and ``--etcd`` on the top-level parser (with their defaults)."""
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="the local stack's home (default MICROCO_HOME, else ~/.microco)",
    )
    parser.add_argument(
        "--etcd", default="", help="the platform's etcd (default MICROCO_ETCD, else the local stack's)"
    )


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if all(child is not seen for seen in out):  # aliases name one parser twice
                    out.append(child)
    return out


def share_flags(parser: argparse.ArgumentParser, inherited: tuple[argparse.Action, ...] = ()) -> None:
    """Give every parser under ``parser`` the optional flags of the parsers above it."""
    own = {opt: a for a in parser._actions for opt in a.option_strings}
    passed: list[argparse.Action] = []
    for flag in inherited:
        mine = {own[o] for o in flag.option_strings if o in own}
        if not mine:
            dup = copy.copy(flag)
            dup.default = argparse.SUPPRESS
            dup.required = False
            parser._add_action(dup)
            passed.append(dup)
        elif all(a.dest == flag.dest for a in mine):
            for a in mine:  # the same flag declared again here: the value from above stands
                a.default = argparse.SUPPRESS
            passed.append(flag)
        # else: this command gives the option string a meaning of its own; it keeps it
    children = _subparsers(parser)
    if not children:
        return
    names = {o for f in passed for o in f.option_strings}
    for a in parser._actions:
        if a.option_strings and not isinstance(a, _NOT_SHARED) and not names & set(a.option_strings):
            passed.append(a)
    for child in children:
        share_flags(child, tuple(passed))
