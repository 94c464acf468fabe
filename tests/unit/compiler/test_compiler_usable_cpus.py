"""The cores a training process may use, not the machine's (issue 18, session 43, held out): a
job the node agent pins to its cores (an affinity mask) or a container with a CPU quota. A job
pinned to 2 of a 16-core host's cores found 14 idle: its background compiles were on
(``AstraTorch(background=None)``) with 13 compile threads, all on the job's own 2 cores."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from microco.clients.compiler import _background, _session, _torch

pytestmark = pytest.mark.torch

IDLE_CORES = _session.idle_cores  # (the compiler tests' conftest fixes it at 64 for each test)


@pytest.fixture
def sixteen_core_host(monkeypatch, tmp_path):
    """A 16-core host at a load of one (this job's thread), with no CPU quota."""
    monkeypatch.setattr(_session.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(_session.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    unlimited = tmp_path / "cpu.max"
    unlimited.write_text("max 100000\n")
    monkeypatch.setattr(_session, "CGROUP_CPU_MAX", str(unlimited), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(_session, "idle_cores", IDLE_CORES)
    return monkeypatch


def test_a_job_pinned_to_two_cores_of_sixteen_has_no_core_to_spare(sixteen_core_host):
    sixteen_core_host.setattr(_session.os, "sched_getaffinity", lambda pid: {4, 5}, raising=False)
    assert not _torch.spare_core()  # (2 cores, 1 of load, 1 training thread)
    assert _background.compile_threads() == 1
    assert int(max(_torch.thread_choices(), key=int)) <= 2
    assert _session.usable_cpus() == 2


def test_a_container_limited_to_three_cpus_uses_three(sixteen_core_host, tmp_path):
    sixteen_core_host.setattr(_session.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    quota = tmp_path / "quota.max"
    quota.write_text("300000 100000\n")
    sixteen_core_host.setattr(_session, "CGROUP_CPU_MAX", str(quota))
    assert _background.compile_threads() == 1  # (3 usable, 1 of load: 2 idle, one left for training)
    assert _session.usable_cpus() == 3


def test_the_whole_host_is_used_where_nothing_limits_the_job(sixteen_core_host):
    sixteen_core_host.setattr(_session.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert _torch.spare_core()
    assert _background.compile_threads() == 14
    assert _session.usable_cpus() == 16
