"""The named registry of policies: ``@register_policy(name, config=Cfg)`` and ``make_policy``."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ._types import ClusterView, Decision, PolicyError


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: a pure function of its config and the observed state.

    ``decide`` must not read clocks, files or the network, and must not keep state between
    calls that changes its answers: the same view gives the same decisions, in the live
    scheduler, in the simulator and after a fail-over.
    """

    name: str

    def decide(self, view: ClusterView) -> list[Decision]: ...


_REGISTRY: dict[str, tuple[type, type]] = {}

# What a config field of each plain type accepts (bool is an int to Python; not here), and how
# the error names it. Options come from JSON (--policy-config) and the command line.
_OPTION_KINDS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def register_policy(name: str, *, config: type) -> Callable[[type], type]:
    """Class decorator: register a policy class under ``name`` with its frozen config type.

    The class is constructed as ``cls(config_instance)`` and must set ``name``.
    """
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config for policy {name!r} must be a dataclass")

    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name][0] is not cls:
            raise PolicyError(f"policy {name!r} registered twice")
        _REGISTRY[name] = (cls, config)
        return cls

    return deco


def available_policies() -> list[str]:
    """Names of every registered policy, sorted."""
    return sorted(_REGISTRY)


def policy_config_type(name: str) -> type:
    """The config dataclass of policy ``name`` (for CLIs that expose its fields as flags)."""
    return _lookup(name)[1]


def _lookup(name: str) -> tuple[type, type]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; available: {', '.join(available_policies())}") from None


def make_policy(name: str, **config: Any) -> Policy:
    """Build policy ``name`` with its config fields given as keywords.

    Raises :class:`PolicyError` for an unknown name, an unknown config field or a value the
    config rejects.
    """
    cls, cfg_type = _lookup(name)
    known = {f.name for f in dataclasses.fields(cfg_type)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise PolicyError(
            f"policy {name!r} has no option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    hints = typing.get_type_hints(cfg_type)
    for key, value in config.items():
        want = _OPTION_KINDS.get(hints.get(key))
        if want is not None and not want[0](value):
            raise PolicyError(f"option {key} of policy {name!r} must be {want[1]}, got {value!r}")
    try:
        cfg = cfg_type(**config)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"bad config for policy {name!r}: {exc}") from exc
    return cls(cfg)
