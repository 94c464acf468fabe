"""The shared gRPC service lifecycle on real processes: registration, kill -9 lease expiry,
graceful SIGTERM, health, error mapping, malformed and oversized requests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from _support import scaled, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

from microco.api.common.v1 import common_pb2, common_pb2_grpc
from microco.common import EtcdKV, InvalidArgument, NotFound, ServiceClient, Unavailable, dial, discover
from microco.services.runtime import ServiceRuntime, ServiceSettings
from microco.services.runtime.server import _INFO_SERVICE

pytestmark = pytest.mark.integration

PROBE = Path(__file__).with_name("probe_service.py")


def start_probe(etcd_endpoint: str, tmp_path: Path, instance: str, ttl: int = 2) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(PROBE),
            "--etcd",
            etcd_endpoint,
            "--instance-id",
            instance,
            "--lease-ttl-s",
            str(ttl),
            "--data-dir",
            str(tmp_path),
            "--grace-s",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def health_of(address: str) -> str:
    with dial(address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def test_killed_service_vanishes_and_restarted_one_reregisters(
    etcd_kv: EtcdKV, etcd_endpoint: str, tmp_path: Path
) -> None:
    proc = start_probe(etcd_endpoint, tmp_path, "p1", ttl=2)
    try:
        assert wait_for(lambda: len(discover(etcd_kv, "probe")) == 1, timeout=15), (
            proc.stdout.read1().decode()
        )
        rec = discover(etcd_kv, "probe")[0]
        assert rec.instance_id == "p1" and rec.metrics_address
        assert health_of(rec.address) == "SERVING"
        with dial(rec.address) as ch:
            info = common_pb2_grpc.InfoServiceStub(ch).GetInfo(common_pb2.GetInfoRequest(), timeout=2)
        assert info.name == "probe" and info.instance_id == "p1"
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        t0 = time.monotonic()
        assert wait_for(lambda: discover(etcd_kv, "probe") == [], timeout=10)
        # within the lease TTL (plus etcd's expiry tick), not a later sweep; stretched as the wait is
        assert time.monotonic() - t0 < scaled(2 + 3)
    finally:
        proc.kill()
    again = start_probe(etcd_endpoint, tmp_path, "p1", ttl=2)
    try:
        assert wait_for(lambda: len(discover(etcd_kv, "probe")) == 1, timeout=15)
    finally:
        again.kill()
        again.wait(5)


def test_sigterm_is_graceful(etcd_kv: EtcdKV, etcd_endpoint: str, tmp_path: Path) -> None:
    proc = start_probe(etcd_endpoint, tmp_path, "p2", ttl=60)
    assert wait_for(lambda: len(discover(etcd_kv, "probe")) == 1, timeout=15)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(15)) == 0
    # The registration is revoked at shutdown, before its 60 s lease could expire (a 10 s lease
    # and "within 8 s" was a figure a loaded machine could miss).
    assert discover(etcd_kv, "probe") == []
    assert time.monotonic() - t0 < 60
    out = proc.stdout.read().decode()
    assert '"msg": "stopping"' in out


def test_sigterm_during_start_up_stops_it_gracefully(
    etcd_kv: EtcdKV, etcd_endpoint: str, tmp_path: Path
) -> None:
    """A signal while the service is still starting (here: a setup that takes 30 s) stops it at
    once with exit 0, and nothing is left registered."""
    env = {**os.environ, "PROBE_SETUP_S": "600"}  # (longer than the test may take)
    proc = subprocess.Popen(
        [sys.executable, str(PROBE), "--etcd", etcd_endpoint, "--data-dir", str(tmp_path), "--grace-s", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    try:
        while b"setting up" not in proc.stdout.readline():
            assert proc.poll() is None, "the probe ended before its setup"
        proc.send_signal(signal.SIGTERM)
        # interrupted, not waited out: the setup alone would take 10 minutes (the limit was 30 s
        # from the probe's start, its interpreter's start-up included)
        assert proc.wait(scaled(15)) == 0
    finally:
        proc.kill()
    assert discover(etcd_kv, "probe") == []


def test_unreachable_etcd_at_start_up_is_a_clear_error(tmp_path: Path) -> None:
    from microco.services.stack import free_port

    port = free_port()
    proc = subprocess.run(
        [sys.executable, str(PROBE), "--etcd", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert f"cannot reach etcd at 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_flags_are_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(PROBE), "--port", "99999", "--etcd", "x:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "port 99999" in proc.stderr


class FailingInfo(common_pb2_grpc.InfoServiceServicer):
    """Raises what it is told to, to prove the error mapping end to end."""

    def __init__(self) -> None:
        self.raise_next: Exception | None = None

    def GetInfo(self, request, context):
        if self.raise_next is not None:
            raise self.raise_next
        return common_pb2.ServiceInfo(name="ok")


class InfoClient(ServiceClient):
    def get_info(self, timeout: float | None = None) -> common_pb2.ServiceInfo:
        stub = common_pb2_grpc.InfoServiceStub(self._channel)
        return self._call(stub.GetInfo, common_pb2.GetInfoRequest(), timeout=timeout, idempotent=True)


@pytest.fixture
def runtime():
    servicer = FailingInfo()
    rt = ServiceRuntime(ServiceSettings(name="errs", metrics_port=-1, max_message_bytes=64 * 1024))
    rt.add_service(common_pb2_grpc.add_InfoServiceServicer_to_server, servicer, _INFO_SERVICE)
    rt.start(register=False)
    yield rt, servicer
    rt.stop(grace=0)


def test_error_mapping_round_trip(runtime) -> None:
    rt, servicer = runtime
    client = InfoClient.from_address(rt.address)
    assert client.get_info().name == "ok"
    servicer.raise_next = NotFound("no job 42")
    with pytest.raises(NotFound, match="no job 42"):
        client.get_info()
    servicer.raise_next = InvalidArgument("devices must be > 0")
    with pytest.raises(InvalidArgument):
        client.get_info()
    servicer.raise_next = ZeroDivisionError("secret detail")
    with pytest.raises(Exception) as info:
        client.get_info()
    assert info.value.grpc_code == grpc.StatusCode.INTERNAL
    assert "secret detail" not in str(info.value)
    servicer.raise_next = None
    assert client.get_info().name == "ok"  # still serving
    client.close()


def test_malformed_and_oversized_requests(runtime) -> None:
    rt, _ = runtime
    with dial(rt.address) as ch:
        raw = ch.unary_unary(f"/{_INFO_SERVICE}/GetInfo")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff\xff", timeout=2)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x0a" + b"\x80" * 10 + b"x" * (128 * 1024), timeout=2)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert health_of(rt.address) == "SERVING"


def test_retry_only_unavailable_and_only_idempotent() -> None:
    from microco.services.stack import free_port

    client = InfoClient.from_address(f"127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    with pytest.raises(Unavailable):
        client.get_info(timeout=3)
    # given up at its deadline, not after a retry's own (at most a busy machine's delay past it)
    assert time.monotonic() - t0 < 3 + scaled(0.5)
    client.close()


def test_graceful_stop_sets_not_serving(etcd_kv: EtcdKV) -> None:
    rt = ServiceRuntime(ServiceSettings(name="graceful", metrics_port=0), kv=etcd_kv).start()
    address = rt.address
    assert health_of(address) == "SERVING"
    assert [r.address for r in discover(etcd_kv, "graceful")] == [address]
    import urllib.error
    import urllib.request

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{rt.metrics_address}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    assert "microco_service_up" in get("/metrics")[1]
    # The probes an orchestrator uses (plain HTTP on the metrics port): alive, and ready while
    # serving and registered; not ready once a graceful stop has begun (seen from a stop hook).
    assert get("/healthz") == (200, "ok\n")
    assert get("/readyz") == (200, "ready\n")
    during_stop: list[tuple[int, str]] = []
    rt.on_stop(lambda: during_stop.extend([get("/readyz"), get("/healthz")]))
    rt.stop(grace=1)
    rt.stop()  # idempotent
    assert during_stop == [(503, "not ready\n"), (200, "ok\n")]
    assert discover(etcd_kv, "graceful") == []
    assert os.environ.get("NO_SUCH") is None


def test_labels_advertised_before_registering_are_registered(etcd_kv: EtcdKV) -> None:
    """An election won before the service registers (the scheduler's leader once never carried
    ``role=leader``): the label set then is in the first registration, and a later change is
    put again."""
    rt = ServiceRuntime(ServiceSettings(name="elected", metrics_port=-1), kv=etcd_kv)
    rt.advertise(role="leader")  # not registered yet
    rt.start()
    try:
        (rec,) = discover(etcd_kv, "elected")
        assert rec.labels["role"] == "leader"
        rt.advertise(role="standby")
        (rec,) = discover(etcd_kv, "elected")
        assert rec.labels["role"] == "standby" and rec.address == rt.address
    finally:
        rt.stop(grace=0)
