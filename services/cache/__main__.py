"""``python -m microco.services.cache``: one Quiver cache server (one per host)."""

from __future__ import annotations

import sys

from microco.services.runtime.server import run_service

from ._servicer import add_arguments, setup


def main(argv: list[str] | None = None) -> int:
    return run_service(
        "cache",
        "Quiver cache server: keeps content-addressed training-data chunks on local disk and serves them.",
        setup,
        add_arguments,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
