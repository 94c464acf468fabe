"""A job that runs without the scheduler's hook: detected (no report within the grace after
its start), shown as not preemptible in its history, left alone by gandiva's time-slicing
(no suspend attempted and refused every tick), refused with a reason by operator commands,
and its end is said plainly ("its steps were not reported")."""

from __future__ import annotations

import sys

import pytest
from _support import wait_for_jobs as wait_for

from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec
from microco.common import channel_for
from microco.common.errors import FailedPrecondition
from microco.services.scheduler._local import spawn_scheduler, stop_process

pytestmark = pytest.mark.integration


def test_job_without_the_hook_is_shown_and_treated_as_not_preemptible(
    agents, etcd_endpoint, etcd_kv, tmp_path
):
    agents("n1", devices=1)
    log = tmp_path / "scheduler.log"
    sched = spawn_scheduler(
        etcd_endpoint,
        tmp_path / "sched",
        policy="gandiva",
        policy_config={"quantum_s": 0.5, "enable_packing": False},
        tick_s=0.2,
        kv=etcd_kv,
        log_path=log,
        extra_args=["--hook-grace-s", "1"],
    )
    try:
        c = SchedulerClient(channel_for(etcd_kv, "scheduler"))
        # a plain loop (no hook) that ends once a file appears
        stop = tmp_path / "stop"
        code = f"import os, time\nwhile not os.path.exists({str(stop)!r}): time.sleep(0.05)\n"
        plain = c.submit(make_spec([sys.executable, "-c", code], devices=1, name="plain")).id
        hooked = [
            sys.executable,
            "-m",
            "microco.examples.synthetic_job",
            "--steps",
            "20",
            "--compute-ms",
            "1",
        ]

        def rec(j):
            return etcd_kv.get_json(f"/microco/scheduler/jobs/{j}")

        wait_for(lambda: rec(plain).get("no_hook"), etcd_kv, 30, "the job without the hook detected")
        waiting = c.submit(make_spec(hooked, devices=1, name="waits")).id
        note = [h for h in rec(plain)["history"] if "not preemptible" in h[2]]
        assert note and note[0][1] == "running", rec(plain)["history"]
        with pytest.raises(FailedPrecondition, match="runs without the scheduler's hook"):
            c.control(plain, "suspend")
        # the waiting job's quantum-driven turn never comes while the plain job runs...
        wait_for(
            lambda: len(rec(waiting)["history"]) >= 1 and rec(plain)["attained_service_s"] > 2,
            etcd_kv,
            30,
            "ticks pass",
        )
        assert rec(waiting)["state"] == "queued" and rec(plain)["state"] == "running"
        assert "refused" not in log.read_text()  # no suspend tried (and refused) every tick
        # ...and comes once it ends; its end is said plainly
        stop.write_text("")
        wait_for(
            lambda: job_to_dict(c.get(waiting))["state"] == "finished", etcd_kv, 60, "the other job runs"
        )
        msg = job_to_dict(c.get(plain))["message"]
        assert msg == "finished (its steps were not reported: it ran without the scheduler's hook)", msg
    finally:
        stop_process(sched)
