"""The job table's save (MemoryKV): a lost race merges exactly what the API may change on an
existing job (``cancel_requested``, ``operator``) and abandons the tick on anything else."""

from __future__ import annotations

from dataclasses import replace

import pytest

from microco.common.errors import Aborted
from microco.common.kv import MemoryKV
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._record import OperatorRequest
from microco.services.scheduler._store import JobStore


def _stored_job(kv: MemoryKV) -> str:
    rec = J.new_record(J.validate_spec({"command": ["train"], "devices": 1}, None, check_command=False), 1.0)
    JobStore(kv).create(rec)
    return rec.id


def test_a_cancel_and_an_operator_command_written_meanwhile_are_merged() -> None:
    kv = MemoryKV()
    jid = _stored_job(kv)
    leader = JobStore(kv)
    rec = leader.load()[jid]
    api = JobStore(kv)  # another instance serves the API while the leader's tick runs
    api.change(jid, lambda r: replace(r, cancel_requested=True, message="cancel requested"))
    api.change(jid, lambda r: replace(r, operator=OperatorRequest("suspend", (), 0, 2.0)))
    saved = leader.save(rec.with_state(J.RUNNING, "started", 3.0, devices=("n1/0",), node="n1"))
    assert saved.state == J.RUNNING and saved.cancel_requested
    assert saved.operator == OperatorRequest("suspend", (), 0, 2.0)
    assert api.get(jid) == saved and leader.jobs[jid] == saved


def test_another_writer_changing_the_job_abandons_the_tick() -> None:
    kv = MemoryKV()
    jid = _stored_job(kv)
    leader = JobStore(kv)
    rec = leader.load()[jid]
    other = JobStore(kv)  # a second leader (this one lost leadership mid-tick)
    other.load()
    other.save(rec.with_state(J.RUNNING, "started elsewhere", 2.0, devices=("n2/0",), node="n2"))
    with pytest.raises(Aborted):
        leader.save(rec.with_state(J.RUNNING, "started", 3.0, devices=("n1/0",), node="n1"))
    assert JobStore(kv).get(jid).node == "n2"
