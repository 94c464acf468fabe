"""Leader election of store coordinators (``services/store/_standby.py``) on an in-memory etcd:
one acts (serves, runs recovery), the other refuses naming it, and takes over when the
leader's lease is gone. The real processes and a client across a SIGKILL fail-over:
``tests/integration/store/test_store_cluster.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from _support import wait_until

from microco.common.calls import never_served
from microco.common.election import LEADER_PREFIX, NOT_LEADER
from microco.common.errors import InvalidArgument, Unavailable
from microco.common.kv import MemoryKV
from microco.services.store._standby import RPCS, CoordinatorElection


class Loop:
    """Stands for the RecoveryLoop: records that it ran and was stopped."""

    def __init__(self, log: list[str], who: str) -> None:
        self.log, self.who = log, who
        log.append(f"start {who}")

    def stop(self) -> None:
        self.log.append(f"stop {self.who}")


TTL_S = 5


def wait_for(cond: Any, what: str, timeout: float = 20.0) -> None:
    wait_until(cond, timeout, what, interval=0.02)


def runtime() -> Any:
    """A service runtime as the election finds it: built, not started (not registered yet)."""
    from microco.services.runtime.server import ServiceRuntime
    from microco.services.runtime.settings import ServiceSettings

    return ServiceRuntime(ServiceSettings(name="store", metrics_port=-1, labels={"node": "h"}))


def role(election: CoordinatorElection) -> str:
    return str(election.runtime.settings.labels["role"])  # type: ignore[union-attr]


def servicer() -> SimpleNamespace:
    return SimpleNamespace(**{name: (lambda req, ctx, name=name: f"{name} served") for name in RPCS})


def test_one_coordinator_acts_the_other_refuses_then_takes_over() -> None:
    kv = MemoryKV()
    log: list[str] = []
    # Leases of 5 s: the hand-over below is the leader's lease revoked, not one run out; with
    # 1 s leases, on a machine busy enough to delay a keep-alive, the new leader lost its own
    # lease too and the two changed places again (a CI run of 2026-12-03, session 23)
    a = CoordinatorElection(kv, "coord-a", TTL_S, lambda: Loop(log, "a"), runtime()).start()
    b = CoordinatorElection(kv, "coord-b", TTL_S, lambda: Loop(log, "b"), runtime()).start()
    try:
        assert a.is_leader and not b.is_leader
        assert (role(a), role(b)) == ("leader", "standby")  # what the registration advertises
        assert log == ["start a"]  # the standby runs no recovery
        sa, sb = a.guard(servicer()), b.guard(servicer())
        assert sa.Append(iter(()), None) == "Append served"
        for name in ("Append", "CreateTable", "Query", "StartRecovery", "GrantTableRead"):
            with pytest.raises(Unavailable, match=f"coord-b {NOT_LEADER}; the leader is coord-a") as info:
                getattr(sb, name)(None, None)
            assert never_served(info.value)  # a client may send it again, to the leader
        # The leader's lease is gone (its process died; here: revoked under it).
        assert a.election._keeper is not None
        a.election._keeper.lease.revoke()
        wait_for(
            lambda: b.is_leader and role(b) == "leader" and "start b" in log,
            "the standby leads (and runs recovery) once the leader's lease is gone",
        )
        wait_for(
            lambda: not a.is_leader and "stop a" in log and role(a) == "standby",
            "the deposed leader stops its recovery and says it stands by",
        )
        assert kv.get(LEADER_PREFIX + "store") == b"coord-b"
        assert log[-1] in ("start b", "stop a") and log.count("start b") == 1
        assert sb.Query(None, None) == "Query served"
        with pytest.raises(Unavailable, match="the leader is coord-b"):
            sa.Append(None, None)
    finally:
        b.stop()
        a.stop()
    assert log.count("stop b") == 1


def test_no_leader_yet_says_a_fail_over_is_under_way() -> None:
    kv = MemoryKV()
    c = CoordinatorElection(kv, "coord-c", 1, lambda: None)
    with pytest.raises(Unavailable, match="no leader is elected yet"):
        c.check()


def test_never_served_only_for_calls_that_did_nothing() -> None:
    assert never_served(Unavailable("failed to connect to all addresses; last error: refused"))
    assert never_served(Unavailable(f"store coordinator x {NOT_LEADER}; the leader is y"))
    assert not never_served(Unavailable("Socket closed"))  # may have run: not sent again
    assert not never_served(InvalidArgument(f"{NOT_LEADER}"))
