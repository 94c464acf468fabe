"""The REST API in process (no sockets): auth on every endpoint but health, the admin token to
change anything, honest "not available" answers, the published OpenAPI schema and the page."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from microco.common.kv import MemoryKV
from microco.services.console import DEFAULT_DEV_TOKEN, ConsoleConfig, create_app
from microco.services.console._gateway import SYSTEMS

ADMIN = {"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"}
VIEWER = {"Authorization": "Bearer viewer-token-123"}
JOB = {"name": "t", "command": ["python", "x.py"], "devices": 1}


@pytest.fixture
def client() -> Iterator[TestClient]:
    cfg = ConsoleConfig(profile="dev", view_token="viewer-token-123")
    app = create_app(cfg, MemoryKV(), start_recorder=False, use_redis=False)
    with TestClient(app) as c:
        yield c


def test_health_needs_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True


def _api_routes(client: TestClient) -> list[tuple[str, str]]:
    spec = client.get("/api/v1/openapi.json").json()
    out = []
    for path, ops in spec["paths"].items():
        for method in ops:
            concrete = path.replace("{job_id}", "j1").replace("{name}", "t").replace("{key}", "k")
            out.append((method.upper(), concrete))
    return out


def test_every_endpoint_but_health_needs_a_token(client: TestClient) -> None:
    routes = _api_routes(client)
    assert len(routes) >= 12
    for method, path in routes:
        if path in ("/healthz", "/readyz"):
            continue
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
            r = client.request(method, path, headers=headers, json=JOB if method == "POST" else None)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert r.headers.get("www-authenticate") == "Bearer"
            assert r.json()["error"] == "Unauthenticated"


def test_viewer_reads_but_cannot_change(client: TestClient) -> None:
    assert client.get("/api/v1/whoami", headers=VIEWER).json()["role"] == "viewer"
    assert client.get("/api/v1/services", headers=VIEWER).status_code == 200
    r = client.post("/api/v1/jobs", headers=VIEWER, json=JOB)
    assert r.status_code == 403 and r.json()["error"] == "PermissionDenied"
    assert client.post("/api/v1/jobs/j1/cancel", headers=VIEWER).status_code == 403


def test_whoami_flags_the_default_token(client: TestClient) -> None:
    me = client.get("/api/v1/whoami", headers=ADMIN).json()
    assert me["role"] == "admin" and me["default_token"] is True and me["profile"] == "dev"


def test_services_from_the_registry(client: TestClient) -> None:
    r = client.get("/api/v1/services", headers=ADMIN)
    assert r.status_code == 200 and r.json()["services"] == []


def test_absent_systems_say_so(client: TestClient) -> None:
    for path, system in (
        ("/api/v1/jobs", "scheduler"),
        ("/api/v1/cache", "cache"),
        ("/api/v1/store", "store"),
        ("/api/v1/compiler", "compiler"),
    ):
        body = client.get(path, headers=ADMIN).json()
        assert body["available"] is False
        if SYSTEMS[system].in_build():
            assert "no live instance" in body["reason"]
        else:
            assert "not available in this build" in body["reason"]
    systems = client.get("/api/v1/systems", headers=ADMIN).json()["systems"]
    assert {s["name"] for s in systems} == set(SYSTEMS)


def test_admin_change_without_scheduler_is_a_clear_error(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", headers=ADMIN, json=JOB)
    assert r.status_code in (501, 503)
    assert "scheduler" in r.json()["message"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {**JOB, "devices": 0},
        {**JOB, "devices": -1},
        {**JOB, "command": []},
        {**JOB, "name": ""},
        {**JOB, "unknown": 1},
        {**JOB, "devices": "two"},
        # Found by schemathesis: beyond int64, and text no protobuf string can carry.
        {**JOB, "total_steps": 447690951711271485440},
        {**JOB, "name": "\udac8\udffe-\ud9da"},
        {**JOB, "env": {"\ud800": "x"}},
    ],
)
def test_bad_job_specs_are_refused_before_reaching_the_scheduler(client: TestClient, body: dict) -> None:
    # Sent as ASCII JSON (\uXXXX escapes), as a fuzzer or a foreign client would.
    raw = json.dumps(body)
    headers = {**ADMIN, "Content-Type": "application/json"}
    assert client.post("/api/v1/jobs", headers=headers, content=raw).status_code == 422


def test_unknown_state_filter(client: TestClient) -> None:
    if not SYSTEMS["scheduler"].in_build():
        pytest.skip("the scheduler is not part of this build")
    r = client.get("/api/v1/jobs", headers=ADMIN, params={"state": "sleepy"})
    assert r.status_code in (200, 400)  # 200 "not running" when no scheduler is registered


def test_openapi_is_published_with_bearer_security(client: TestClient) -> None:
    spec = client.get("/api/v1/openapi.json").json()
    assert spec["info"]["title"] == "microco console"
    assert spec["components"]["securitySchemes"]["ConsoleToken"]["scheme"] == "bearer"
    assert "security" in spec["paths"]["/api/v1/jobs"]["post"]
    assert "security" not in spec["paths"]["/healthz"]["get"]


def test_page_and_assets_are_served_locally(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "microco console" in page.text
    for asset in ("/static/app.js", "/static/plots.js", "/static/style.css", "/static/favicon.svg"):
        assert client.get(asset).status_code == 200
    # FastAPI's docs pages would pull scripts from a CDN: not served
    assert client.get("/api/docs").status_code == 404 and client.get("/docs").status_code == 404
    # offline: nothing on the page points outside the console
    import re

    from microco.services.console import STATIC_DIR

    for f in STATIC_DIR.iterdir():
        text = f.read_text()
        assert not re.search(r"(src|href)=[\"']https?://", text), f.name
        assert "cdn" not in text.lower(), f.name


def test_every_error_has_the_same_shape(client: TestClient) -> None:
    r = client.post(
        "/api/v1/jobs", headers={**ADMIN, "Content-Type": "application/json"}, content=b"\x0f*not json"
    )
    assert r.status_code in (400, 422)
    if r.status_code == 400:
        assert r.json()["error"] == "InvalidArgument"
    r = client.get("/api/v1/no-such-endpoint", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"] == "NotFound"
    r = client.delete("/api/v1/services", headers=ADMIN)
    assert r.status_code == 405 and r.json()["error"] == "MethodNotAllowed"


def test_metrics_need_a_token_and_count_requests_by_route(client: TestClient) -> None:
    assert client.get("/metrics").status_code == 401
    client.get("/api/v1/jobs/some-job", headers=ADMIN)
    text = client.get("/metrics", headers=ADMIN).text
    assert 'microco_console_http_requests_total{method="GET",route="/api/v1/jobs/{job_id}"' in text
    assert "some-job" not in text  # route templates, not ids: bounded series
