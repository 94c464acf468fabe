"""``python -m microco.services.scheduler``: one scheduler instance (leader or standby)."""

from microco.services.runtime.server import run_service

from ._service import add_arguments, setup

if __name__ == "__main__":
    raise SystemExit(
        run_service(
            "scheduler",
            "microco scheduler (Gandiva): schedules training jobs on node agents",
            setup,
            add_arguments,
        )
    )
