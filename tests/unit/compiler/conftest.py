"""Every compiler test gets an empty record of this host's compile costs (``_compile_costs``):
the estimates a test sees come from what it records, never from earlier runs on the machine."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _host_compile_costs(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROCO_COMPILE_COSTS", str(tmp_path / "compile_costs.json"))
    # and an empty record of tuned configurations (the wrappers' default explorer is on disk)
    monkeypatch.setenv("MICROCO_COMPILER_STATE", str(tmp_path / "compiler_state.json"))


@pytest.fixture(autouse=True)
def _steady_load(monkeypatch):
    """One machine load for the whole test: a committed thread count is re-validated when the
    load read from /proc/loadavg moves between runs, which on a shared CI machine depends on what
    runs beside the test. Tests of that re-validation set the load themselves."""
    from microco.clients.compiler import _session

    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    # and idle cores for every thread-count trial (tests of the refusal set it themselves)
    monkeypatch.setattr(_session, "idle_cores", lambda: 64.0)
    # and compile prices at the load they were measured at (tests of the scaling set it)
    from microco.clients.compiler import _compile_costs

    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)


def _intra_op_threads(n):
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (the count is process-wide), the old count after it."""
    yield from _intra_op_threads(1)


@pytest.fixture
def two_threads():
    """Two intra-op threads for the test, the old count after it."""
    yield from _intra_op_threads(2)
