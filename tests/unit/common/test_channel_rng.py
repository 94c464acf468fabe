"""Finding a service leaves a job's ``random`` stream as it was: a training job that seeds
Python's ``random`` (data order, augmentation) draws the same numbers with the platform's clients
as without them. Before (held out, session 32), ``pick_instance`` and the compiler client dialled
with ``random.choice``, which takes a number from that stream even to choose among one instance."""

from __future__ import annotations

import random

from microco.common import MemoryKV
from microco.common.channel import pick_instance
from microco.common.registry import ServiceRecord


def test_picking_an_instance_draws_nothing_from_the_jobs_random_stream():
    kv = MemoryKV()
    for i in range(3):
        rec = ServiceRecord("cache", f"i{i}", f"127.0.0.1:{5000 + i}")
        kv.put(rec.key, rec.to_json())
    random.seed(7)
    state = random.getstate()
    picked = {pick_instance(kv, "cache", prefer_leader=False).instance_id for _ in range(50)}
    assert random.getstate() == state
    assert picked <= {"i0", "i1", "i2"} and len(picked) > 1  # still spread over the instances
