"""``microco up --policy NAME --policy-config FILE``: the scheduling policy of the live stack.

The names are the policy registry's (the same plugins ``microco sim --policy`` simulates); the
configuration is a JSON object of the policy's settings, text or a file. Both are checked here,
before anything starts, by building the policy once, so a typo is an error at ``microco up``
rather than a scheduler that exits and is restarted until the supervisor gives up. Every
scheduler of the stack (leader and standby) is started with the same policy and settings,
passed as JSON text so a restart does not depend on the file staying where it was.
"""

from __future__ import annotations

import json
from typing import Any

from microco.common.errors import InvalidArgument

DEFAULT_POLICY = "gandiva"


def resolve_policy(name: str, config: str | dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The policy name and its settings, checked: ``InvalidArgument`` naming the policies
    there are, or what is wrong with a setting."""
    from microco.services.scheduler import load_policy_config
    from microco.services.scheduler.policy import PolicyError, available_policies, make_policy

    if name not in available_policies():
        raise InvalidArgument(f"unknown policy {name!r}; available: {', '.join(available_policies())}")
    if config is None or config == "":
        settings: dict[str, Any] = {}
    elif isinstance(config, dict):
        settings = dict(config)
    else:
        settings = load_policy_config(config)
    try:
        make_policy(name, **settings)
    except PolicyError as exc:
        raise InvalidArgument(str(exc)) from None
    return name, settings


def scheduler_args(policy: str, config: dict[str, Any]) -> tuple[str, ...]:
    """The scheduler service's command-line arguments for this policy."""
    args: tuple[str, ...] = ("--policy", policy)
    if config:
        args += ("--policy-config", json.dumps(config, sort_keys=True))
    return args
