"""``python -m microco.services.agent``: the node agent of one host."""

from microco.services.runtime.server import run_service

from ._service import add_arguments, setup

if __name__ == "__main__":
    raise SystemExit(
        run_service(
            "agent",
            "microco node agent: launches and controls training jobs on this host",
            setup,
            add_arguments,
        )
    )
