"""The job spec on the wire: the one mapping between a spec dict and the ``JobSpec`` message.

The dict is the form every end of the scheduler speaks: the scheduler's stored record keeps it,
the CLI (``make_spec``) and the console build it, and ``spec_from_pb`` gives it back. Its keys
are the message's field names, except the owner, which is flattened to ``user`` and ``tenant``.
Protobuf only (no gRPC): the scheduler service, the CLI and the console all map through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from microco.api.common.v1 import common_pb2
from microco.api.scheduler.v1 import scheduler_pb2
from microco.common.errors import InvalidArgument

# Dict keys that are JobSpec fields of the same name (the owner is mapped on its own).
_PLAIN = (
    "name",
    "command",
    "devices",
    "elastic",
    "priority",
    "env",
    "workdir",
    "total_steps",
    "model",
    "max_devices",
    "gpu_share",
)

# Every key of the dict form, in the message's field order.
SPEC_KEYS = (*_PLAIN[:5], "user", "tenant", *_PLAIN[5:])


def _given(value: Any) -> bool:
    return value is not None and value != ""


def spec_to_pb(spec: Mapping[str, Any]) -> scheduler_pb2.JobSpec:
    """The ``JobSpec`` of a spec dict. A key that is missing, None or ``""`` leaves its field at
    the message's default; other keys are ignored (a stored record may carry more than the
    message). A value of the wrong type is ``InvalidArgument`` naming the field."""
    kwargs: dict[str, Any] = {k: spec[k] for k in _PLAIN if _given(spec.get(k))}
    owner = {k: spec[k] for k in ("user", "tenant") if _given(spec.get(k))}
    msg = scheduler_pb2.JobSpec()
    key = "owner"
    try:
        msg.owner.CopyFrom(common_pb2.Principal(**owner))
        for key, value in kwargs.items():
            if key == "command":
                if isinstance(value, str | bytes):
                    raise TypeError("expected a list of strings (the argv), got one string")
                msg.command.extend(value)
            elif key == "env":
                if not isinstance(value, Mapping):
                    raise TypeError(f"expected a mapping of strings, got {type(value).__name__}")
                msg.env.update(value)
            else:
                setattr(msg, key, value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"invalid job spec field {key!r}: {exc}") from None
    return msg


def spec_from_pb(spec: scheduler_pb2.JobSpec) -> dict[str, Any]:
    """The spec dict of a ``JobSpec``: every key of ``SPEC_KEYS``, defaults included."""
    return {
        "name": spec.name,
        "command": list(spec.command),
        "devices": spec.devices,
        "elastic": spec.elastic,
        "priority": spec.priority,
        "user": spec.owner.user,
        "tenant": spec.owner.tenant,
        "env": dict(spec.env),
        "workdir": spec.workdir,
        "total_steps": spec.total_steps,
        "model": spec.model,
        "max_devices": spec.max_devices,
        "gpu_share": spec.gpu_share,
    }
