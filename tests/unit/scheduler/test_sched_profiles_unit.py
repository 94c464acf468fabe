"""Profiles keyed by what a job is: runs of one script that differ only in where they write
share one; an edited script does not; a job submitted again starts with what was measured of
the earlier one (alone time, busy fraction, the size past which growing did not pay), and its
history says what its profile holds or why it has none."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from microco.common.kv import MemoryKV
from microco.services.scheduler import SchedulerCore
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._profiles import PROFILES_PREFIX, job_identity
from microco.services.scheduler._record import JobRecord
from microco.services.scheduler.policy import make_policy


def spec(command, **kw):
    return J.validate_spec({"command": command, "devices": 1, **kw}, None, check_command=False)


def key(command, **kw):
    return job_identity(spec(command, **kw))[0]


def test_output_paths_and_platform_addresses_are_not_part_of_a_job(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    base = ["python", str(script), "--lr", "0.1"]
    k = key([*base, "--out", "/runs/1/result.json", "--etcd", "127.0.0.1:2379"])
    assert key([*base, "--out", "/runs/2/result.json", "--etcd", "127.0.0.1:40001"]) == k
    assert key([*base, "--output-dir=/tmp/a", "--etcd=10.0.0.1:2379"]) == key([*base, "--output-dir=/tmp/b"])
    assert key([*base, "--checkpoint-dir", "/ckpt/x"]) == key(base)
    # what the job computes is part of it
    assert key(["python", str(script), "--lr", "0.2"]) != key(base)
    # the interpreter's path is not: the same script under another python is the same job
    assert key(["/usr/bin/python", str(script), "--lr", "0.1"]) == key(base)
    # a negative number after an output option is taken as its value, not as another option
    assert key([*base, "--log", "-3"]) == key(base)


def test_a_script_counts_by_its_content(tmp_path: Path) -> None:
    a = tmp_path / "a" / "train.py"
    b = tmp_path / "b" / "train.py"
    for p in (a, b):
        p.parent.mkdir()
        p.write_text("print('same code')\n")
    assert key(["python", str(a)]) == key(["python", str(b)])  # moved: the same job
    # a relative path is read under the job's working directory
    assert key(["python", "train.py"], workdir=str(a.parent)) == key(["python", str(a)])
    b.write_text("print('edited')\n")
    assert key(["python", str(b)]) != key(["python", str(a)])  # edited: another job


def test_a_named_model_is_the_identity() -> None:
    k, described = job_identity(spec(["python", "x.py", "--seed", "1"], model="resnet50"))
    assert described == "model resnet50"
    assert key(["python", "y.py", "--seed", "2"], model="resnet50") == k


def _core(kv: MemoryKV) -> SchedulerCore:
    return SchedulerCore(kv, make_policy("gandiva"), check_commands=False)


def _queued(kv: MemoryKV, command, now: float, **kw) -> JobRecord:
    rec = J.new_record(spec(command, **kw), now=now)
    kv.put(J.job_key(rec.id), rec.to_json())
    return rec


def _stored(kv: MemoryKV, rec: JobRecord) -> JobRecord:
    return JobRecord.from_json(kv.get(J.job_key(rec.id)))


def test_a_job_submitted_again_starts_with_what_was_learned() -> None:
    kv = MemoryKV()
    cmd = [sys.executable, "-m", "some.trainer", "--batch", "64"]
    first = _queued(kv, [*cmd, "--out", "run-1.json"], now=1.0)
    core = _core(kv)
    core.tick()
    first = _stored(kv, first)
    assert first.history[-1].message.startswith("no profile yet for command ")
    # what the leader measured while the first job ran alone (see _reconcile), then a grow to
    # 2 devices that did not pay, undone
    first = replace(
        first, state=J.RUNNING, devices=("n1/0",), node="n1", minibatch_ms_alone=12.5, utilization=0.4
    )
    core.profiles.learn_alone(first)
    first = replace(first, max_useful_devices=2)
    core.profiles.learn_max_useful(first)
    assert len(kv.get_prefix(PROFILES_PREFIX)) == 1

    # Another leader (it reads the profiles from etcd); the same job, other output path.
    again = _queued(kv, [*cmd, "--out", "run-2.json"], now=50.0)
    other = _queued(kv, [sys.executable, "-m", "other.trainer"], now=51.0)
    core2 = _core(kv)
    core2.tick()
    again = _stored(kv, again)
    other = _stored(kv, other)
    assert again.profile is not None and first.profile is not None
    assert again.profile.key == first.profile.key
    said = again.history[-1].message
    assert said.startswith("profile of command ") and "-m some.trainer --batch 64 from earlier jobs:" in said
    assert "12.5 ms per mini-batch alone on 1 device" in said and "40% busy alone" in said
    assert "growing to 2 devices did not pay" in said
    assert "no profile yet for command " in other.history[-1].message
    assert "-m other.trainer: the first job of its kind" in other.history[-1].message

    views = {j.id: j for j in core2.observe(60.0).jobs}
    assert views[again.id].minibatch_ms_alone == 12.5
    assert views[again.id].utilization == 0.4
    assert views[again.id].max_useful_devices == 2
    assert views[other.id].minibatch_ms_alone is None and views[other.id].utilization is None


def test_a_slower_measurement_does_not_replace_the_profile() -> None:
    kv = MemoryKV()
    core = _core(kv)
    rec = J.new_record(spec(["train"], model="m"), now=0.0)
    rec = replace(rec, state=J.RUNNING, devices=("n1/0",), minibatch_ms_alone=10.0)
    core.profiles.learn_alone(rec)
    rec = replace(rec, minibatch_ms_alone=30.0)  # measured under load from outside the job
    core.profiles.learn_alone(rec)
    ((_, stored),) = kv.get_prefix_json(PROFILES_PREFIX)
    assert stored["minibatch_ms"] == {"1": 10.0} and stored["identity"] == "model m"
