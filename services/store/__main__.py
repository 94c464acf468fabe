"""``python -m microco.services.store [flags]`` runs the coordinator;
``python -m microco.services.store node --node NAME --fault-domain RACK [flags]`` runs a store node."""

from __future__ import annotations

import sys

from ._service import main_coordinator, main_node


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "node":
        return main_node(argv[1:])
    if argv and argv[0] == "coordinator":
        argv = argv[1:]
    return main_coordinator(argv)


if __name__ == "__main__":
    sys.exit(main())
