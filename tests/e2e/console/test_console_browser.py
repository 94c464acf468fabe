"""The console in a real headless browser (Debian's chromium driven by Playwright): sign in, see
the services, submit a job from the page and watch it appear and change state on its device
timeline; then, with a cache server and a compiler service added, one job's page with its
timeline, its cache hits and its compiler configuration together. Screenshots are kept under
test-artifacts/."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from _support import lazy_import, needs, synthetic_job

CHROMIUM = os.environ.get("MICROCO_CHROMIUM", "/usr/bin/chromium")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() or shutil.which("chromium")),
        reason="chromium is not installed (apt-get install chromium)",
    ),
    needs("playwright"),
]

# Imported by the first test (1.7 s), not at every xdist worker's collection.
sync_api = lazy_import("playwright.sync_api")

from console_harness import LINKS_JOB, Platform, links_servers

from microco.services.console import DEFAULT_DEV_TOKEN
from microco.services.console._gateway import SYSTEMS

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def page(platform: Platform):
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        pg = context.new_page()
        pg.set_default_timeout(20_000)
        pg.requested_hosts = set()  # type: ignore[attr-defined]
        pg.on("request", lambda req: pg.requested_hosts.add(urlparse(req.url).netloc))  # type: ignore[attr-defined]
        pg.errors = []  # type: ignore[attr-defined]
        pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))  # type: ignore[attr-defined]
        pg.on("console", lambda msg: pg.errors.append(msg.text) if msg.type == "error" else None)  # type: ignore[attr-defined]
        yield pg
        browser.close()


def job_command(steps: int) -> list[str]:
    return synthetic_job(steps, 5, 15)


def test_sign_in_submit_and_watch_a_job(platform: Platform, page, artifacts_dir: Path) -> None:
    expect = sync_api.expect
    page.goto(platform.url + "/")

    # a wrong token is refused, the right one signs in
    expect(page.locator("#login")).to_be_visible()
    page.fill("#login-token", "not-the-token")
    page.click("#login-button")
    expect(page.locator("#login-error")).to_have_text("wrong token")
    page.fill("#login-token", DEFAULT_DEV_TOKEN)
    page.click("#login-button")
    expect(page.locator("#login")).to_be_hidden()
    expect(page.locator("#banner")).to_contain_text("default development token")

    # the services view: the console itself and the services behind it, healthy
    console_row = page.locator(f'#services-table tr[data-instance="{platform.console.name}"]')
    expect(console_row).to_contain_text("SERVING")
    for proc in platform.others.values():
        expect(page.locator(f'#services-table tr[data-instance="{proc.name}"]')).to_contain_text("SERVING")
    page.screenshot(path=str(artifacts_dir / "console-services.png"), full_page=True)

    if not SYSTEMS["scheduler"].in_build():
        pytest.skip("the scheduler is not part of this build: only the services view was checked")

    # another job holds the only device when ours arrives, so the two must take turns
    other = httpx.post(
        platform.url + "/api/v1/jobs",
        headers={"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"},
        json={"name": "other-job", "command": job_command(200), "devices": 1},
    )
    assert other.status_code == 201, other.text
    other_id = other.json()["id"]

    # submit a job from the page
    page.click('#tabs a[data-tab="jobs"]')
    expect(page.locator("#submit-form")).to_be_visible()
    page.fill("#submit-name", "browser-job")
    page.fill("#submit-command", " ".join(job_command(120)))
    page.fill("#submit-devices", "1")
    page.click("#submit-button")
    expect(page.locator("#submit-result")).to_contain_text("submitted browser-job")
    job_id = page.locator("#submit-result").inner_text().split()[-1]
    row = page.locator(f'#jobs-table tr[data-job-id="{job_id}"]')
    expect(row).to_be_visible()

    # ... and watch it change state: queued behind the other job, running on the device in turns
    # with it (time-slicing: suspended and resumed at mini-batch boundaries), then finished
    expect(row).to_have_attribute("data-state", "running", timeout=60_000)
    # (at least one running period: on a loaded machine it may have taken turns already)
    expect(page.locator(f'svg.timeline g[data-job-id="{job_id}"] rect.period-running').first).to_be_visible()
    page.screenshot(path=str(artifacts_dir / "console-job-running.png"), full_page=True)
    expect(row).to_have_attribute("data-state", "finished", timeout=90_000)
    timeline = page.locator(f'#jobs-timeline svg.timeline g[data-job-id="{job_id}"] rect.period')
    states = [timeline.nth(i).get_attribute("data-state") for i in range(timeline.count())]
    assert states[0] == "queued" and "running" in states and states[-1] == "finished", states
    other_row = page.locator(f'#jobs-table tr[data-job-id="{other_id}"]')
    expect(other_row).to_have_attribute("data-state", "finished", timeout=90_000)
    suspended = page.locator("svg.timeline rect.period-suspended")
    assert suspended.count() >= 1, "the two jobs never took turns on the device"
    expect(page.locator("#job-detail")).to_be_visible()  # the submitted job is selected
    # its steps-over-time plot (one line, or more where the samples had a gap)
    expect(page.locator("#job-steps svg polyline").first).to_be_visible()
    expect(page.locator("#job-log")).to_contain_text("finished 120 steps")  # and its output
    # the scheduler's decisions about it, newest first, under the policy that made them
    expect(page.locator("#job-decisions tbody tr").first).to_have_attribute("data-state", "finished")
    expect(page.locator("#job-decisions")).to_contain_text("suspend")
    # the job across the systems on the same view (GET /jobs/{id}/links): its own timeline, and
    # the cache and compiler, which this platform does not run, saying so rather than showing zeros
    mine = page.locator(f'#job-links-timeline svg.timeline g[data-job-id="{job_id}"] rect.period')
    expect(mine.last).to_have_attribute("data-state", "finished")
    assert mine.first.get_attribute("data-state") == "queued"
    expect(page.locator("#job-cache-note")).to_contain_text("cache: no live instance is registered")
    expect(page.locator("#job-compiler")).to_contain_text("compiler: no live instance is registered")
    expect(page.locator("#jobs-policy")).to_contain_text("scheduling policy gandiva")
    # with the settings in force: those given at start-up (conftest) and the defaults
    expect(page.locator("#jobs-policy")).to_contain_text("quantum_s 1.5")
    expect(page.locator("#jobs-policy")).to_contain_text("enable_packing false")
    page.screenshot(path=str(artifacts_dir / "console-job-finished.png"), full_page=True)

    # other views render without errors
    for tab in ("nodes", "cache", "store", "compiler"):
        page.click(f'#tabs a[data-tab="{tab}"]')
        expect(page.locator(f"#tab-{tab}")).to_be_visible()
        expect(page.locator("#status-line")).to_contain_text("updated")
    page.screenshot(path=str(artifacts_dir / "console-compiler.png"), full_page=True)

    # the wall-screen views: one lane per device and the utilisation heatmap, over a chosen window
    page.select_option("#window", "900")
    page.click('#tabs a[data-tab="nodes"]')
    expect(page.locator("#device-lanes svg.timeline")).to_be_visible()
    expect(page.locator("#device-heatmap rect.heat-cell").first).to_be_visible()
    page.screenshot(path=str(artifacts_dir / "console-devices.png"), full_page=True)

    # no script error anywhere (the wrong-token sign-in is an expected 401 the browser logs)
    assert [e for e in page.errors if "401" not in e] == [], page.errors
    # everything the page loaded came from the console itself: it works offline
    assert page.requested_hosts <= {urlparse(platform.url).netloc}, page.requested_hosts


def test_a_jobs_page_shows_its_timeline_cache_hits_and_compiler_configuration(
    platform: Platform, page, artifacts_dir: Path, tmp_path: Path
) -> None:
    """Issue 21's page for a job in the browser, filled from real services: a job run by the
    scheduler reads through a cache server (3 of 4 samples hit) and has its training step tuned
    by the compiler service (``console_harness.LINKS_JOB``, the job of the API's test); its page
    shows its device timeline, those hits and the committed configuration."""
    if not all(SYSTEMS[s].in_build() for s in ("scheduler", "agent", "cache", "compiler")):
        pytest.skip("the scheduler, agent, cache or compiler is not part of this build")
    expect = sync_api.expect
    with links_servers(platform) as servers:
        cache, compiler = servers["cache"], servers["compiler"]
        assert cache.record is not None and compiler.record is not None
        script = tmp_path / "links_job.py"
        script.write_text(LINKS_JOB)
        tag = f"b{int(time.time() * 1000) % 10**9}"
        command = [sys.executable, str(script), cache.record.address, compiler.record.address, tag]
        r = httpx.post(
            platform.url + "/api/v1/jobs",
            headers={"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"},
            json={"name": "browser-links", "command": command, "devices": 1},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        page.goto(platform.url + "/")
        page.fill("#login-token", DEFAULT_DEV_TOKEN)
        page.click("#login-button")
        expect(page.locator("#login")).to_be_hidden()
        page.click('#tabs a[data-tab="jobs"]')
        row = page.locator(f'#jobs-table tr[data-job-id="{job_id}"]')
        expect(row).to_have_attribute("data-state", "finished", timeout=120_000)
        row.click()
        expect(page.locator("#job-detail")).to_be_visible()
        # its devices' timeline: queued, then running, then finished
        mine = page.locator(f'#job-links-timeline svg.timeline g[data-job-id="{job_id}"] rect.period')
        expect(mine.last).to_have_attribute("data-state", "finished")
        assert mine.first.get_attribute("data-state") == "queued"
        assert "running" in [mine.nth(i).get_attribute("data-state") for i in range(mine.count())]
        # its cache hits, counted by the cache server it read through
        expect(page.locator("#job-cache-note")).to_contain_text("3 hits, 1 misses (75%)")
        dataset = page.locator(f'#job-cache tr[data-dataset="links-{tag}"]')
        expect(dataset).to_be_visible()
        expect(dataset).to_contain_text(cache.name)
        # its compiler configuration: the graph its step registered, committed, with the values
        graph = page.locator("#job-compiler .compiler-graph", has_text="links-model")
        expect(graph).to_contain_text("committed")
        expect(graph.locator(".job-registration")).to_contain_text("registered by this job")
        expect(graph.locator("table tr", has_text="fusion")).to_contain_text("fused")
        page.screenshot(path=str(artifacts_dir / "console-job-links.png"), full_page=True)
        assert page.errors == [], page.errors
