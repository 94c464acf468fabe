"""Jobs through the console: submitted and cancelled via the scheduler's gRPC API, shown with the
device timeline built from the scheduler's state history and the placements the console saw."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest
from _support import synthetic_job
from console_harness import VIEW_TOKEN, Platform

from microco.services.console import DEFAULT_DEV_TOKEN
from microco.services.console._gateway import SYSTEMS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (SYSTEMS["scheduler"].in_build() and SYSTEMS["agent"].in_build()),
        reason="the scheduler or the node agent is not part of this build",
    ),
]

ADMIN = {"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"}
VIEWER = {"Authorization": f"Bearer {VIEW_TOKEN}"}


def job_command(steps: int, compute_ms: float = 5, io_ms: float = 10) -> list[str]:
    return synthetic_job(steps, compute_ms, io_ms)


def wait_state(
    platform: Platform, job_id: str, states: set[str], timeout: float = 60.0, *, stepping: bool = False
) -> dict:
    """``stepping``: also wait until the job has reported a mini-batch (an operator's suspend
    acts at a mini-batch boundary, and is refused before the job's first one)."""
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = httpx.get(f"{platform.url}/api/v1/jobs/{job_id}", headers=ADMIN, timeout=10).json()
        if job["state"] in states and (not stepping or job.get("step", 0) > 0):
            return job
        time.sleep(0.3)
    raise AssertionError(
        f"job {job_id} not in {states} after {timeout:.0f}s: {job.get('state')} {job.get('message')}"
    )


def test_submit_run_and_see_the_timeline(platform: Platform) -> None:
    r = httpx.post(
        platform.url + "/api/v1/jobs",
        headers=ADMIN,
        json={"name": "console-run", "command": job_command(60), "devices": 1, "user": "alice"},
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    listed = httpx.get(platform.url + "/api/v1/jobs", headers=ADMIN).json()
    assert listed["available"] is True and job_id in [j["id"] for j in listed["jobs"]]

    job = wait_state(platform, job_id, {"finished", "failed"})
    assert job["state"] == "finished", job["message"]
    assert job["step"] == 60 and job["spec"]["owner"]["user"] == "alice"
    states = [p["state"] for p in job["timeline"]]
    assert states[0] == "queued" and "running" in states and states[-1] == "finished"
    running = [p for p in job["timeline"] if p["state"] == "running"]
    assert all(p["devices"] and p["end"] > p["start"] for p in running), job["timeline"]
    assert job["seconds_in_state"]["running"] > 0
    # the scheduler's own history (etcd) came through, and the console sampled progress (Redis)
    assert [h["state"] for h in job["history"]][:1] == ["queued"]
    assert job["progress"] and max(p["step"] for p in job["progress"]) > 0
    # its output, from the node that ran it (a viewer may read it)
    log = httpx.get(
        f"{platform.url}/api/v1/jobs/{job_id}/log", headers=VIEWER, params={"tail": 1}, timeout=10
    )
    assert log.status_code == 200, log.text
    assert log.json()["text"].startswith("finished 60 steps, digest ") and log.json()["text"].count("\n") == 1
    assert log.json()["available"] and log.json()["attempt"] in log.json()["attempts"] and log.json()["node"]
    missing = httpx.get(f"{platform.url}/api/v1/jobs/no-such-job-1/log", headers=VIEWER, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"] == "NotFound"
    bad_tail = httpx.get(
        f"{platform.url}/api/v1/jobs/{job_id}/log", headers=VIEWER, params={"tail": 0}, timeout=10
    )
    assert bad_tail.status_code == 422

    only_finished = httpx.get(
        platform.url + "/api/v1/jobs", headers=ADMIN, params={"state": "finished"}
    ).json()
    assert all(j["state"] == "finished" for j in only_finished["jobs"]) and job_id in [
        j["id"] for j in only_finished["jobs"]
    ]
    assert (
        httpx.get(platform.url + "/api/v1/jobs", headers=ADMIN, params={"state": "sleepy"}).status_code == 400
    )


def test_operator_commands_and_cancel_need_the_admin_token(platform: Platform) -> None:
    r = httpx.post(
        platform.url + "/api/v1/jobs",
        headers=ADMIN,
        json={"name": "console-cancel", "command": job_command(100000, 5, 20), "devices": 1},
    )
    job_id = r.json()["id"]
    try:
        wait_state(platform, job_id, {"running", "queued"})
        assert httpx.post(f"{platform.url}/api/v1/jobs/{job_id}/cancel").status_code == 401
        assert httpx.post(f"{platform.url}/api/v1/jobs/{job_id}/cancel", headers=VIEWER).status_code == 403
        assert httpx.get(f"{platform.url}/api/v1/jobs/{job_id}", headers=VIEWER).json()["state"] in (
            "queued",
            "running",
        )
        # Operator commands, as `microco job suspend|resume` sends them: admin only, checked at once.
        control = f"{platform.url}/api/v1/jobs/{job_id}/control"
        assert httpx.post(control, json={"action": "suspend"}, headers=VIEWER).status_code == 403
        assert httpx.post(control, json={"action": "explode"}, headers=ADMIN).status_code == 422
        assert (
            httpx.post(
                f"{platform.url}/api/v1/jobs/no-such-job/control", json={"action": "suspend"}, headers=ADMIN
            )
        ).status_code == 404
        wait_state(platform, job_id, {"running"}, stepping=True)
        r = httpx.post(control, json={"action": "suspend"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        wait_state(platform, job_id, {"suspended"})
        r = httpx.post(control, json={"action": "resume"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        wait_state(platform, job_id, {"running"})
        r = httpx.post(f"{platform.url}/api/v1/jobs/{job_id}/cancel", headers=ADMIN)
        assert r.status_code == 200, r.text
        job = wait_state(platform, job_id, {"cancelled"})
        assert job["timeline"][-1]["state"] == "cancelled"
        states = [p["state"] for p in job["timeline"]]
        assert "suspended" in states, states  # the operator's suspend is on the job's timeline
    finally:  # a failure here must not leave the job holding the device for the next test
        httpx.post(f"{platform.url}/api/v1/jobs/{job_id}/cancel", headers=ADMIN, timeout=10)


def test_the_schedulers_refusals_come_through_clearly(platform: Platform) -> None:
    r = httpx.post(
        platform.url + "/api/v1/jobs",
        headers=ADMIN,
        json={"name": "too-big", "command": job_command(1), "devices": 64},
    )
    assert r.status_code == 400 and "devices" in r.json()["message"]
    r = httpx.post(
        platform.url + "/api/v1/jobs",
        headers=ADMIN,
        json={"name": "nope", "command": ["/no/such/program"], "devices": 1},
    )
    assert r.status_code == 400 and "/no/such/program" in r.json()["message"]
    assert httpx.get(platform.url + "/api/v1/jobs/no-such-job", headers=ADMIN).status_code == 404
    assert httpx.post(platform.url + "/api/v1/jobs/no-such-job/cancel", headers=ADMIN).status_code == 404


def test_nodes_and_devices(platform: Platform) -> None:
    body = httpx.get(platform.url + "/api/v1/nodes", headers=ADMIN).json()
    agent = platform.others["agent"]
    node = next(n for n in body["nodes"] if n["info"].get("instance_id") == agent.name)
    assert [d["node"] for d in body["devices"]].count(node["name"]) == 1
    assert body["scheduler"]["leader"] == platform.others["scheduler"].name
    # the policy with every setting in force, defaults included
    from microco.services.scheduler.policy import policy_config_type

    settings = body["scheduler"]["policy_settings"]
    assert set(settings) == {
        f.name for f in dataclasses.fields(policy_config_type(body["scheduler"]["policy"]))
    }
    assert all(isinstance(d["jobs"], list) for d in body["devices"])


def test_a_running_job_shows_on_its_device(platform: Platform) -> None:
    r = httpx.post(
        platform.url + "/api/v1/jobs",
        headers=ADMIN,
        json={"name": "console-device", "command": job_command(100000, 5, 20), "devices": 1},
    )
    job_id = r.json()["id"]
    try:
        job = wait_state(platform, job_id, {"running"})
        body = httpx.get(platform.url + "/api/v1/nodes", headers=ADMIN).json()
        (device,) = [d for d in body["devices"] if d["id"] == job["device_ids"][0]]
        assert {"id": job_id, "state": "running"} in device["jobs"]
    finally:
        httpx.post(f"{platform.url}/api/v1/jobs/{job_id}/cancel", headers=ADMIN)
        wait_state(platform, job_id, {"cancelled", "finished", "failed"})
