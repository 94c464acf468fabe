"""Protobuf to JSON for the page: short enum names, numbers stay numbers, unknown fields pass."""

from microco.api.common.v1 import common_pb2
from microco.api.scheduler.v1 import scheduler_pb2
from microco.services.console._proto import enum_name, enum_number, to_dict


def test_job_to_dict() -> None:
    job = scheduler_pb2.Job(
        id="j1",
        spec=scheduler_pb2.JobSpec(name="mnist", command=["python", "t.py"], devices=2, env={"A": "1"}),
        state=scheduler_pb2.JOB_STATE_RUNNING,
        device_ids=["n/0", "n/1"],
        step=12345678901,
    )
    d = to_dict(job)
    assert d["state"] == "running"
    assert d["step"] == 12345678901 and isinstance(d["step"], int)
    assert d["spec"]["command"] == ["python", "t.py"] and d["spec"]["env"] == {"A": "1"}
    assert d["spec"]["owner"] is None  # unset sub-message
    assert d["device_ids"] == ["n/0", "n/1"]


def test_enum_round_trip() -> None:
    desc = scheduler_pb2.JobState.DESCRIPTOR
    for value in desc.values:
        short = enum_name(desc, value.number)
        assert enum_number(desc, short) == value.number
    assert enum_number(desc, "nonsense") is None
    assert enum_name(desc, 999) == "999"


def test_bytes_left_out() -> None:
    d = to_dict(common_pb2.Device(id="n/0", memory_bytes=1 << 40))
    assert d["memory_bytes"] == 1 << 40
