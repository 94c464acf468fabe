"""Growth that must pay, on the live scheduler: an elastic job whose mini-batches take as long
on two devices as on one is grown onto an idle device, judged from its measured mini-batch
times, shrunk back, and not grown again; both resizes are in its history and the job itself
carried them out at mini-batch boundaries."""

from __future__ import annotations

import sys

import pytest
from _support import wait_for_jobs as wait_for

from microco.clients.scheduler import SchedulerClient, make_spec
from microco.common import channel_for
from microco.services.scheduler._local import spawn_scheduler, stop_process

pytestmark = pytest.mark.integration


def test_a_grow_that_does_not_pay_is_undone_and_not_repeated(agents, etcd_endpoint, etcd_kv, tmp_path):
    agents("n1", devices=2)
    sched = spawn_scheduler(
        etcd_endpoint,
        tmp_path / "sched",
        policy="gandiva",
        # a grow must triple the throughput: a job whose step time does not depend on its
        # devices cannot pass that by measurement noise on a busy machine
        policy_config={"quantum_s": 0.5, "enable_packing": False, "grow_keep_ratio": 3.0},
        tick_s=0.2,
        kv=etcd_kv,
        log_path=tmp_path / "scheduler.log",
    )
    try:
        c = SchedulerClient(channel_for(etcd_kv, "scheduler"))
        cmd = [
            sys.executable,
            "-m",
            "microco.examples.synthetic_job",
            "--steps",
            "100000",
            "--compute-ms",
            "2",
        ]
        e = c.submit(make_spec(cmd, devices=1, elastic=True, name="elastic")).id

        def rec():
            return etcd_kv.get_json(f"/microco/scheduler/jobs/{e}")

        wait_for(lambda: rec().get("max_useful_devices") == 2, etcd_kv, 60, "a grow judged and undone")
        r = rec()
        resizes = [h[2] for h in r["history"] if h[2].startswith("resized")]
        assert len(resizes) == 2, r["history"]
        assert resizes[0].startswith("resized from 1 to 2 devices: gandiva: grow onto idle devices")
        assert resizes[1].startswith("resized from 2 to 1 devices: gandiva: undo grow to 2 devices")
        assert "ms/step" in resizes[1]
        # not grown again, though a device stays idle: the job trains on, on one device
        step = r["step"]
        wait_for(lambda: rec()["step"] > step + 100 and rec()["pending"] is None, etcd_kv, 60, "trains on")
        r = rec()
        assert len(r["devices"]) == 1 and r["state"] == "running" and r["attempt"] == 1
        assert len([h for h in r["history"] if h[2].startswith("resized")]) == 2, r["history"]
        c.cancel(e)
    finally:
        stop_process(sched)
