"""Protobuf messages to plain JSON-able values, the way a browser wants them.

Unlike ``json_format.MessageToDict`` this keeps 64-bit integers as numbers (the figures the
console shows fit a double), names enum values by their short lower-case name (``running``, not
``JOB_STATE_RUNNING``), and leaves bytes out (schemas and blobs are not for the page). Fields the
console does not know yet pass through unchanged, so a service adding a field needs no console
change to show it in the API.
"""

from __future__ import annotations

import math
import re
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message


def _enum_prefix(enum: EnumDescriptor) -> str:
    # JobState -> JOB_STATE_ (the proto style guide's prefix for enum values)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def enum_name(enum: EnumDescriptor, number: int) -> str:
    """Short lower-case name of an enum value: ``JOB_STATE_RUNNING`` -> ``running``."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    name = value.name
    prefix = _enum_prefix(enum)
    name = name.removeprefix(prefix)
    return name.lower()


def enum_number(enum: EnumDescriptor, short: str) -> int | None:
    """Inverse of ``enum_name``; None when ``short`` names no value."""
    wanted = (_enum_prefix(enum) + short).upper()
    for value in enum.values:
        if value.name in (wanted, short.upper()):
            return int(value.number)
    return None


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_name(field.enum_type, value)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_dict(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return None
    if isinstance(value, float) and math.isnan(value):  # NaN is not JSON
        return None
    return value


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 5 prefers ``is_repeated``; ``label`` still works on older releases
    rep = getattr(field, "is_repeated", None)
    return bool(rep) if rep is not None else field.label == FieldDescriptor.LABEL_REPEATED


def to_dict(message: Message) -> dict[str, Any]:
    """Every field of ``message`` (defaults included) as JSON-able Python values."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_BYTES and not _is_repeated(field):
            continue
        value = getattr(message, field.name)
        if _is_map(field):
            vfield = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _scalar(vfield, v) for k, v in value.items()}
        elif _is_repeated(field):
            if field.type == FieldDescriptor.TYPE_BYTES:
                continue
            out[field.name] = [_scalar(field, v) for v in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    return out
