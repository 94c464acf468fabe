"""The one job-spec mapping (clients/scheduler): dict <-> JobSpec over every field of the message.

The sample message is built from the proto descriptor, so a field added to ``JobSpec`` (or to
the ``Principal`` inside it) that the mapping forgets makes these tests fail.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from microco.api.scheduler.v1 import scheduler_pb2
from microco.clients.scheduler import SPEC_KEYS, make_spec, spec_from_pb, spec_to_pb
from microco.common.errors import InvalidArgument

_SCALARS: dict[int, Any] = {
    FieldDescriptor.CPPTYPE_INT32: 3,
    FieldDescriptor.CPPTYPE_INT64: 1 << 40,
    FieldDescriptor.CPPTYPE_UINT32: 5,
    FieldDescriptor.CPPTYPE_UINT64: 1 << 41,
    FieldDescriptor.CPPTYPE_DOUBLE: 0.25,
    FieldDescriptor.CPPTYPE_FLOAT: 0.5,
    FieldDescriptor.CPPTYPE_BOOL: True,
}


def _value(field: FieldDescriptor) -> Any:
    """A value that is not the field's default."""
    if field.cpp_type == FieldDescriptor.CPPTYPE_STRING:
        return f"{field.name}-x"
    if field.cpp_type == FieldDescriptor.CPPTYPE_ENUM:
        return field.enum_type.values[-1].number
    return _SCALARS[field.cpp_type]


def _repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 5 has ``is_repeated``; ``label`` is the older spelling
    rep = getattr(field, "is_repeated", None)
    return bool(rep) if rep is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _filled(descriptor: Descriptor, message: Message) -> Message:
    """``message`` with every field of ``descriptor`` set to a non-default value, recursively."""
    for field in descriptor.fields:
        target = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            target["k1"] = _value(value_field)
            target["k2"] = _value(value_field)
        elif field.message_type is not None:
            if _repeated(field):
                _filled(field.message_type, target.add())
            else:
                _filled(field.message_type, target)
        elif _repeated(field):
            target.extend([_value(field), _value(field)])
        else:
            setattr(message, field.name, _value(field))
    return message


def _full_spec() -> scheduler_pb2.JobSpec:
    spec = _filled(scheduler_pb2.JobSpec.DESCRIPTOR, scheduler_pb2.JobSpec())
    assert isinstance(spec, scheduler_pb2.JobSpec)
    # every field is set: the round trips below cover them all
    assert len(spec.ListFields()) == len(scheduler_pb2.JobSpec.DESCRIPTOR.fields)
    return spec


def test_every_jobspec_field_survives_proto_to_dict_to_proto() -> None:
    spec = _full_spec()
    assert spec_to_pb(spec_from_pb(spec)) == spec


def test_every_spec_key_survives_dict_to_proto_to_dict() -> None:
    d = spec_from_pb(_full_spec())
    assert tuple(d) == SPEC_KEYS
    assert spec_from_pb(spec_to_pb(d)) == d
    # every key reaches its own field: change one key, exactly that value changes
    for key, value in d.items():
        changed = {**d, key: _other(value)}
        assert spec_from_pb(spec_to_pb(changed)) == changed, key


def _other(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "y"
    if isinstance(value, list):
        return [*value, "z"]
    if isinstance(value, dict):
        return {**value, "k3": "z"}
    raise AssertionError(f"no other value for {value!r}")


def test_missing_none_and_empty_keys_leave_the_defaults() -> None:
    spec = spec_to_pb(
        {"name": "t", "command": ["python", "x.py"], "devices": 2, "model": None, "workdir": ""}
    )
    d = spec_from_pb(spec)
    assert d["name"] == "t" and d["command"] == ["python", "x.py"] and d["devices"] == 2
    assert d["model"] == "" and d["workdir"] == "" and d["gpu_share"] == 0.0 and d["env"] == {}
    assert d["user"] == "" and d["tenant"] == ""


def test_make_spec_is_a_keyword_front_end_over_the_mapping() -> None:
    d = spec_from_pb(_full_spec())
    kwargs = {k: v for k, v in d.items() if k != "command"}
    assert make_spec(d["command"], **kwargs) == spec_to_pb(d)


@pytest.mark.parametrize(
    ("key", "value"),
    [("devices", "two"), ("command", "python x.py"), ("env", ["A=1"]), ("gpu_share", "half"), ("user", 7)],
)
def test_a_value_of_the_wrong_type_is_a_clear_error_naming_the_field(key: str, value: Any) -> None:
    with pytest.raises(InvalidArgument, match=key if key != "user" else "owner"):
        spec_to_pb({"name": "t", "command": ["python"], "devices": 1, key: value})


def test_the_scheduler_service_maps_through_the_same_functions() -> None:
    from microco.services import scheduler

    assert scheduler.spec_from_pb is spec_from_pb
    from microco.services.scheduler._jobs import spec_to_pb as service_spec_to_pb

    assert service_spec_to_pb is spec_to_pb
