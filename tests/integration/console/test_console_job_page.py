"""One job's links through the console (issue 21): a job run by the real scheduler and node agent
reads from the real cache server and registers its training step's graph at the real compiler,
and ``GET /api/v1/jobs/{id}/links`` shows its timeline, its hits and its configuration together.

The job is a small script using the clients the platform's loader and compiler wrapper use
(``CacheClient``, ``RemoteExplorer``), with the job id they see (``$MICROCO_JOB_ID``, set by the
node agent) and the job's own credentials (``console_harness.LINKS_JOB``; the browser test shows
the same job's page)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from console_harness import LINKS_JOB, VIEW_TOKEN, Platform, Proc, links_servers

from microco.services.console import DEFAULT_DEV_TOKEN
from microco.services.console._gateway import SYSTEMS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not all(SYSTEMS[s].in_build() for s in ("scheduler", "agent", "cache", "compiler")),
        reason="the scheduler, agent, cache or compiler is not part of this build",
    ),
]

ADMIN = {"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"}
VIEWER = {"Authorization": f"Bearer {VIEW_TOKEN}"}


@pytest.fixture(scope="module")
def servers(platform: Platform) -> Iterator[dict[str, Proc]]:
    with links_servers(platform) as procs:
        yield procs


def test_a_jobs_timeline_hits_and_configuration_on_one_page(
    platform: Platform, servers: dict[str, Proc], tmp_path: Path
) -> None:
    cache, compiler = servers["cache"], servers["compiler"]
    assert cache.record is not None and compiler.record is not None
    script = tmp_path / "links_job.py"
    script.write_text(LINKS_JOB)
    tag = f"t{int(time.time() * 1000) % 10**9}"
    r = httpx.post(
        platform.url + "/api/v1/jobs",
        headers=ADMIN,
        json={
            "name": "console-links",
            "command": [sys.executable, str(script), cache.record.address, compiler.record.address, tag],
            "devices": 1,
        },
        timeout=30,
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    deadline = time.monotonic() + 120
    body: dict = {}
    while time.monotonic() < deadline:
        resp = httpx.get(f"{platform.url}/api/v1/jobs/{job_id}/links", headers=VIEWER, timeout=30)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        if body["job"]["state"] in ("finished", "failed", "cancelled") and body["compiler"]["graphs"]:
            break
        time.sleep(0.5)
    job = body["job"]
    assert job["state"] == "finished", (job["state"], job.get("message"))

    # the timeline: queued, then running on the agent's device, then finished
    states = [p["state"] for p in job["timeline"]]
    assert states[0] == "queued" and "running" in states and states[-1] == "finished", job["timeline"]
    assert any(p["state"] == "running" and p["devices"] for p in job["timeline"])
    assert [h["state"] for h in job["history"]][:1] == ["queued"]

    # its cache hits: the server's counters for this job and its dataset only
    c = body["cache"]
    assert c["available"] is True and c["errors"] == [], c
    log = httpx.get(f"{platform.url}/api/v1/jobs/{job_id}/log", headers=VIEWER, timeout=30).json()
    assert len(c["datasets"]) == 1, (c, log.get("text"))
    [ds] = c["datasets"]
    assert ds["dataset"] == f"links-{tag}" and ds["servers"] == [cache.name], (c, log.get("text"))
    assert (ds["hits"], ds["misses"]) == (3, 1) and ds["hit_rate"] == pytest.approx(0.75)
    assert ds["bytes_served"] == len(tag) * 512

    # its compiler configuration: the graph it registered, with trials and the committed values
    graphs = {g["model_name"]: g for g in body["compiler"]["graphs"]}
    g = graphs["links-model"]
    assert g["job"]["job_id"] == job_id and g["job"]["registered_at"] > 0
    assert g["committed"] is True and g["best"]["values"] == {"fusion": "fused"}
    assert len([t for t in g["trials"] if t["step_ms"] > 0]) >= 2 and g["speedup"] > 1.0
    # the graph registered with another job's id in the request is this job's: its certificate
    # says which job it is (when the platform runs with certificates, as the tests do)
    forged = [x for x in body["compiler"]["graphs"] if x["key"] != g["key"]]
    assert len(forged) == 1 and forged[0]["job"]["job_id"] == job_id

    # an unknown job is 404; no token, 401
    assert httpx.get(f"{platform.url}/api/v1/jobs/no-such-job/links", headers=VIEWER).status_code == 404
    assert httpx.get(f"{platform.url}/api/v1/jobs/{job_id}/links").status_code == 401
