"""Migration and grow-shrink carried out by the live scheduler on real agents and processes."""

from __future__ import annotations

import sys

import pytest
from _support import wait_for_jobs

from microco.clients.agent import AgentDirectory
from microco.clients.scheduler import job_to_dict, make_spec

pytestmark = pytest.mark.integration


def job_cmd(compute_ms=3.0, io_ms=2.0):
    return [
        sys.executable,
        "-m",
        "microco.examples.synthetic_job",
        "--steps",
        "100000",
        "--compute-ms",
        str(compute_ms),
        "--io-ms",
        str(io_ms),
    ]


wait_for = wait_for_jobs


def test_migration_defragments_a_node_and_the_job_continues(agents, sched, etcd_kv):
    agents("n1", devices=2)
    agents("n2", devices=2)
    c = sched({"quantum_s": 1000, "enable_packing": False, "enable_grow_shrink": False})
    ids = [c.submit(make_spec(job_cmd(), devices=1, name=f"s{i}")).id for i in range(4)]
    wait_for(
        lambda: all(
            job_to_dict(c.get(i))["state"] == "running" and job_to_dict(c.get(i))["step"] > 10 for i in ids
        ),
        etcd_kv,
        30,
        "four running",
    )
    placed = {i: job_to_dict(c.get(i))["node"] for i in ids}
    c.cancel(next(i for i in ids if placed[i] == "n1"))
    c.cancel(next(i for i in ids if placed[i] == "n2"))
    # One free device on each node: a 2-device job fits only if a 1-device job moves over.
    big = c.submit(make_spec(job_cmd(), devices=2, name="big")).id
    wait_for(lambda: job_to_dict(c.get(big))["state"] == "running", etcd_kv, 40, "big job placed")
    moved = [
        i
        for i in ids
        if any(h[1] == "migrating" for h in etcd_kv.get_json(f"/microco/scheduler/jobs/{i}")["history"])
    ]
    assert len(moved) == 1
    m = job_to_dict(c.get(moved[0]))
    assert m["state"] == "running" and m["node"] != placed[moved[0]] and m["attempt"] == 2
    assert job_to_dict(c.get(big))["node"] == placed[moved[0]]
    d = AgentDirectory(etcd_kv)
    p = wait_for(
        lambda: [
            p
            for p in d.list_processes(d.nodes()[m["node"]]["address"])
            if p.job_id == m["id"] and p.attempt == 2 and p.job_state
        ],
        etcd_kv,
        20,
        "restored",
    )[0]
    assert p.restored_from_step > 10  # continued from the step it left, not from scratch
    d.close()
    for i in [*ids, big]:
        c.cancel(i)


def test_elastic_job_grows_onto_idle_devices_and_shrinks_for_others(agents, sched, etcd_kv):
    agents("n1", devices=2)
    c = sched({"quantum_s": 1.0, "enable_packing": False, "enable_migration": False})
    e = c.submit(make_spec(job_cmd(), devices=1, elastic=True, name="elastic")).id
    wait_for(lambda: len(job_to_dict(c.get(e))["devices"]) == 2, etcd_kv, 30, "grow to 2 devices")
    d = AgentDirectory(etcd_kv)
    addr = d.nodes()["n1"]["address"]
    # The job itself was told (at a mini-batch boundary) and now runs on both.
    wait_for(
        lambda: [
            p
            for p in d.list_processes(addr)
            if p.job_id == e and p.seq_done >= p.control_seq and len(p.device_ids) == 2
        ],
        etcd_kv,
        10,
        "job acknowledged resize",
    )
    other = c.submit(make_spec(job_cmd(), devices=1, name="other")).id
    wait_for(lambda: job_to_dict(c.get(other))["state"] == "running", etcd_kv, 30, "other starts")
    je = job_to_dict(c.get(e))
    assert len(je["devices"]) == 1 and je["state"] == "running" and je["attempt"] == 1, je[
        "history"
    ]  # in place
    assert set(je["devices"]).isdisjoint(job_to_dict(c.get(other))["devices"])
    d.close()
    c.cancel(e)
    c.cancel(other)
