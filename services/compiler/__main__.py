"""``python -m microco.services.compiler``: the Astra compiler service."""

from __future__ import annotations

import sys

from microco.services.runtime.server import run_service

from ._servicer import add_arguments, setup


def main(argv: list[str] | None = None) -> int:
    return run_service(
        "compiler",
        "Astra compiler service: explores training-step configurations across mini-batches, "
        "commits the fastest, and keeps committed configurations in etcd.",
        setup,
        add_arguments,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
