"""Flags whose help or choices come from modules too heavy to load for every command: the
scheduler's policy names (loading the policy registry loads the scheduler and gRPC, ~1-5 s),
looked up only when ``--help`` is printed or the flag is given."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def policy_names() -> list[str]:
    from microco.services.scheduler.policy import available_policies

    return available_policies()


class PolicyFlag(argparse.Action):
    """``--policy NAME``: checked against the registered policies when given (as ``choices``
    would), and its help lists them when printed (``help`` may hold ``{policies}``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self._help = ""
        super().__init__(option_strings, dest, **kwargs)

    @property  # type: ignore[override]
    def help(self) -> str:  # argparse reads it only to print help
        return self._help.replace("{policies}", ", ".join(policy_names()))

    @help.setter
    def help(self, value: str | None) -> None:
        self._help = value or ""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        names = policy_names()
        if values not in names:
            parser.error(
                f"argument {option_string}: invalid choice: {values!r} (choose from {', '.join(names)})"
            )
        setattr(namespace, self.dest, values)
