"""How many steps the run will take: what the exploration may spend, and what a compile has to
repay, are shares of it (issue 18: a compile that pays only over 5,000 steps must be tried in a
run that long, and not in one of 300).

Said by the user (the wrappers' ``total_steps``), else by the job's environment
(``MICROCO_TOTAL_STEPS``: the scheduler sets it from the job's ``total_steps``, as in
``microco job submit --total-steps 5000``; or whatever launches the training process sets it),
else :data:`DEFAULT_TOTAL_STEPS`."""

from __future__ import annotations

import logging
import os

from microco.clients.scheduler import ENV_TOTAL_STEPS  # set by the scheduler from the job's spec

log = logging.getLogger(__name__)
# Unsaid: the wrappers' default before the environment was read (sessions 1-11).
DEFAULT_TOTAL_STEPS = 1000


def run_length(total_steps: int | None = None) -> int:
    """The run's length in steps: ``total_steps`` when given, else ``$MICROCO_TOTAL_STEPS``,
    else :data:`DEFAULT_TOTAL_STEPS`. A length that is not a positive whole number is refused."""
    if total_steps is not None:
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"total_steps must be a positive number of steps, not {total_steps!r}")
        return total_steps
    said = os.environ.get(ENV_TOTAL_STEPS, "").strip()
    if not said:
        log.info(
            "the run's length is not declared (total_steps=, or $%s); exploring for %d steps",
            ENV_TOTAL_STEPS,
            DEFAULT_TOTAL_STEPS,
        )
        return DEFAULT_TOTAL_STEPS
    try:
        n = int(said)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"${ENV_TOTAL_STEPS}={said!r} is not a positive number of steps")
    return n
