import argparse

import grpc
import pytest

from microco.common import errors
from microco.common.kv import parse_endpoints
from microco.services.runtime.settings import ServiceSettings, add_common_flags, settings_from_args


@pytest.mark.parametrize(
    "cls",
    [
        errors.InvalidArgument,
        errors.NotFound,
        errors.AlreadyExists,
        errors.FailedPrecondition,
        errors.Aborted,
        errors.PermissionDenied,
        errors.Unauthenticated,
        errors.ResourceExhausted,
        errors.Unavailable,
        errors.DeadlineExceeded,
        errors.Internal,
    ],
)
def test_every_error_round_trips_through_its_code(cls: type[errors.MicrocoError]) -> None:
    back = errors.error_for_code(cls.grpc_code, "boom")
    assert type(back) is cls
    assert str(back) == "boom"
    assert 400 <= cls.http_status < 600


def test_unknown_code_keeps_its_code() -> None:
    err = errors.error_for_code(grpc.StatusCode.DATA_LOSS, "gone")
    assert type(err) is errors.MicrocoError
    assert err.grpc_code == grpc.StatusCode.DATA_LOSS


def test_parse_endpoints() -> None:
    assert parse_endpoints("127.0.0.1:2379, http://h:1") == [("127.0.0.1", 2379), ("h", 1)]
    with pytest.raises(errors.InvalidArgument, match="host:port"):
        parse_endpoints("nohost")
    with pytest.raises(errors.InvalidArgument):
        parse_endpoints("")


def test_settings_validate_at_start_up() -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        ServiceSettings(name="x", port=70000, profile="staging", redis="http://x", lease_ttl_s=0)
    msg = str(info.value)
    for fragment in ("port 70000", "profile 'staging'", "redis URL", "lease TTL"):
        assert fragment in msg


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICROCO_ETCD", "10.0.0.1:2379")
    parser = argparse.ArgumentParser()
    add_common_flags(parser)
    args = parser.parse_args(["--port", "5000", "--label", "rack=r1"])
    s = settings_from_args("svc", args)
    assert s.etcd == "10.0.0.1:2379"
    assert s.port == 5000
    assert s.labels == {"rack": "r1"}
    bad = parser.parse_args(["--label", "novalue"])
    with pytest.raises(errors.InvalidArgument, match="KEY=VALUE"):
        settings_from_args("svc", bad)
