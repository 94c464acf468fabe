"""The console process against real etcd, Redis and service processes."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from console_harness import VIEW_TOKEN, Platform, spawn, wait_registered

from microco.services.console import DEFAULT_DEV_TOKEN
from microco.services.console._gateway import SYSTEMS
from microco.services.stack import check_health, free_port

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"}
JOB = {"name": "x", "command": ["python", "-c", "pass"], "devices": 1}


def test_registers_as_an_http_service_and_is_healthy(platform: Platform) -> None:
    rec = platform.console.record
    assert rec is not None and rec.name == "console" and rec.labels["protocol"] == "http"
    assert platform.url.endswith(rec.address.split(":")[-1])
    assert check_health(rec) == "SERVING"  # what `microco up` and `microco status` use
    assert httpx.get(platform.url + "/healthz").status_code == 200
    ready = httpx.get(platform.url + "/readyz").json()
    assert ready == {"ready": True, "etcd": "ok", "redis": "ok"}


def test_services_view_shows_live_instances_and_health(platform: Platform) -> None:
    body = httpx.get(platform.url + "/api/v1/services", headers=ADMIN).json()
    by_name = {(s["name"], s["instance_id"]): s for s in body["services"]}
    assert by_name[("console", platform.console.name)]["health"] == "SERVING"
    for p in platform.others.values():
        assert p.record is not None
        assert by_name[(p.record.name, p.name)]["health"] == "SERVING"


def test_unauthenticated_changes_are_refused_and_change_nothing(platform: Platform) -> None:
    before = httpx.get(platform.url + "/api/v1/jobs", headers=ADMIN).json()
    for headers in ({}, {"Authorization": "Bearer nope"}):
        assert httpx.post(platform.url + "/api/v1/jobs", json=JOB, headers=headers).status_code == 401
        assert httpx.post(platform.url + "/api/v1/jobs/some-job/cancel", headers=headers).status_code == 401
        assert httpx.get(platform.url + "/api/v1/services", headers=headers).status_code == 401
    viewer = {"Authorization": f"Bearer {VIEW_TOKEN}"}
    assert httpx.get(platform.url + "/api/v1/services", headers=viewer).status_code == 200
    assert httpx.post(platform.url + "/api/v1/jobs", json=JOB, headers=viewer).status_code == 403
    after = httpx.get(platform.url + "/api/v1/jobs", headers=ADMIN).json()
    assert [j["id"] for j in after.get("jobs", [])] == [j["id"] for j in before.get("jobs", [])]


@pytest.mark.skipif(not SYSTEMS["cache"].in_build(), reason="the cache is not part of this build")
def test_cache_view_reads_the_real_server_and_plots_hit_rate(platform: Platform) -> None:
    import blake3

    from microco.clients.cache import CacheClient

    cache = platform.others["cache"]
    assert cache.record is not None
    chunk = b"console-test-chunk" * 64
    d_chunk = blake3.blake3(chunk).hexdigest()
    with CacheClient(cache.record.address) as client:
        client.put_chunks([(d_chunk, chunk)], dataset="console-test")

    def read_some() -> None:
        # What a job's loader reports after each mini-batch: hit fraction, seconds, bytes, samples.
        with CacheClient(cache.record.address) as client:
            client.report_progress(
                "console-job",
                "console-test",
                epoch=0,
                consumed=[],
                timings=[(0.75, 0.01, 4096, 4)],
                dataset_bytes=len(chunk),
            )

    deadline = time.monotonic() + 60
    server: dict = {}
    while time.monotonic() < deadline:
        read_some()
        time.sleep(0.6)
        body = httpx.get(platform.url + "/api/v1/cache", headers=ADMIN).json()
        assert body["available"] is True, body
        server = next(s for s in body["servers"] if s["instance_id"] == cache.name)
        assert server["error"] == "" and server["stats"]["capacity_bytes"] == 32 << 20
        if server["hit_rate"]:
            break
    assert server["hit_rate"], "the console recorded no hit-rate sample"
    assert all(p["hit_rate"] == pytest.approx(0.75) for p in server["hit_rate"]), server["hit_rate"]
    assert server["stats"]["hits"] >= 3 and server["stats"]["misses"] >= 1
    assert "console-job" in server["stats"]["jobs"]
    assert any("console-job" in a["jobs"] for a in server["allocations"]), server["allocations"]
    assert any(d["dataset"] == "console-test" for d in server["stats"]["datasets"]), server["stats"]


def test_absent_or_stopped_systems_are_reported_not_invented(platform: Platform) -> None:
    for path, system in (("/api/v1/store", "store"), ("/api/v1/compiler", "compiler")):
        body = httpx.get(platform.url + path, headers=ADMIN).json()
        if not SYSTEMS[system].in_build():
            assert body == {**body, "available": False} and "not available in this build" in body["reason"]
        else:  # in the build but not started by this fixture
            assert body["available"] is False and "no live instance" in body["reason"]


def test_default_token_refused_outside_dev(etcd_endpoint: str, redis_url: str, tmp_path) -> None:
    procs = [
        spawn(
            "microco.services.console",
            ["--http-port", "0"],
            etcd=etcd_endpoint,
            redis=redis_url,
            home=tmp_path,
            instance_id=f"console-prod-{i}",
            profile="prod",
            env={"MICROCO_CONSOLE_TOKEN": token},
        )
        for i, token in enumerate(("", DEFAULT_DEV_TOKEN))
    ]
    for p, message in zip(
        procs, ("admin token is required", "default development token is refused"), strict=True
    ):
        assert p.proc.wait(30) == 2
        assert message in p.log_tail()


def test_sigterm_leaves_the_registry_first(etcd_endpoint: str, redis_url: str, tmp_path) -> None:
    from microco.common.kv import EtcdKV

    kv = EtcdKV(etcd_endpoint)
    port = free_port()
    p = spawn(
        "microco.services.console",
        ["--http-port", str(port)],
        etcd=etcd_endpoint,
        redis=redis_url,
        home=tmp_path,
        instance_id="console-sigterm",
    )
    try:
        wait_registered(kv, "console", p)
        p.proc.send_signal(signal.SIGTERM)
        p.proc.wait(15)
        # the lease was revoked, not left to expire
        assert kv.get("/microco/services/console/console-sigterm") is None
        assert "Shutting down" in p.log_tail()
    finally:
        p.stop()
        kv.close()


def test_cli_prints_token_and_url(
    platform: Platform, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from microco.cli import main

    assert main(["console", "open", "--etcd", platform.etcd, "--no-browser"]) == 0
    assert platform.url.split("//")[1] in capsys.readouterr().out
    monkeypatch.delenv("MICROCO_CONSOLE_TOKEN", raising=False)
    assert main(["console", "token", "--profile", "dev"]) == 0
    assert capsys.readouterr().out.strip() == DEFAULT_DEV_TOKEN
    assert main(["console", "token", "--profile", "prod"]) == 1  # no default outside dev
    monkeypatch.setenv("MICROCO_CONSOLE_TOKEN", "s3cret-token-for-prod")
    assert main(["console", "token", "--profile", "prod"]) == 0
    assert capsys.readouterr().out.strip() == "s3cret-token-for-prod"


def test_losing_redis_costs_plots_not_the_console(etcd_endpoint: str) -> None:
    """Redis holds only the plot series: with it unreachable the console still answers, keeps its
    series in memory, and says so in /readyz."""
    from fastapi.testclient import TestClient

    from microco.common.kv import EtcdKV
    from microco.services.console import ConsoleConfig, create_app
    from microco.services.console._series import SeriesStore

    dead = f"redis://127.0.0.1:{free_port()}/0"
    kv = EtcdKV(etcd_endpoint)
    app = create_app(ConsoleConfig(etcd=etcd_endpoint, redis=dead), kv, start_recorder=False)
    try:
        with TestClient(app) as client:
            ready = client.get("/readyz").json()
            assert ready["ready"] is True and ready["redis"].startswith("unreachable")
            assert client.get("/api/v1/services", headers=ADMIN).status_code == 200
            assert client.get("/api/v1/jobs", headers=ADMIN).status_code == 200
        series: SeriesStore = app.state.console.series
        series.append("probe", {"at": 1.0, "x": 1})
        assert series.read("probe") == [{"at": 1.0, "x": 1}]
    finally:
        kv.close()
