"""Leader election of store coordinators: one acts, the others stand by.

Every coordinator campaigns for ``/microco/leader/store`` (``common.election``, as the scheduler
does). The leader serves the coordinator API and runs the recovery loop; a standby runs no
recovery, gc or scrub, and refuses every coordinator RPC with UNAVAILABLE naming the leader
(``NOT_LEADER`` in the message: nothing was done, so a client sends the call again, appends
included, to the leader). All of the coordinator's state is in etcd, so a standby that wins the
election serves the same catalog at once; a killed leader is replaced within one lease TTL (at
once when the local supervisor removes its key).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from microco.api.store.v1 import store_pb2 as pb
from microco.common.election import NOT_LEADER, LeaderElection
from microco.common.errors import MicrocoError, Unavailable
from microco.common.kv import KV
from microco.common.registry import discover
from microco.services.runtime.server import ServiceRuntime

log = logging.getLogger(__name__)

ELECTION = "store"  # the service name: `microco status` marks leader and standby by it
RPCS = tuple(pb.DESCRIPTOR.services_by_name["StoreCoordinatorService"].methods_by_name)


class CoordinatorElection:
    """The election of one coordinator and what hangs on it: the recovery loop runs (a fresh one
    per term) only while this instance leads, its registration says ``role=leader|standby``, and
    :meth:`guard` makes a standby's servicer refuse every call."""

    def __init__(
        self,
        kv: KV,
        instance_id: str,
        ttl: int,
        start_recovery: Callable[[], Any],
        runtime: ServiceRuntime | None = None,
    ) -> None:
        self.kv, self.instance_id = kv, instance_id
        self.runtime = runtime
        self._start_recovery = start_recovery
        self.recovery: Any = None  # the running RecoveryLoop, while leading
        self._lock = threading.Lock()
        self._role_lock = threading.Lock()
        self._stopped = False
        self.election = LeaderElection(
            kv, ELECTION, instance_id, ttl=ttl, on_elected=self._elected, on_lost=self._lost
        )

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def start(self, settle_s: float = 5.0) -> CoordinatorElection:
        """Campaign, and wait (at most ``settle_s``) until this instance leads or another one
        does, so that a lone coordinator serves from its first call."""
        self._set_role()
        self.election.start()
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and not self.election.wait_until_leader(0.05):
            try:
                if self.election.leader() not in (None, self.instance_id):
                    break
            except MicrocoError:
                pass
        self._set_role()  # the outcome, before the runtime registers with these settings
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self.election.resign()
        self._stop_recovery()

    def _elected(self) -> None:
        with self._lock:
            if self._stopped:
                return
            log.info("store coordinator %s leads: starting recovery", self.instance_id)
            if self.recovery is None:
                self.recovery = self._start_recovery()
        self._set_role()

    def _lost(self) -> None:
        log.warning("store coordinator %s no longer leads: recovery stopped", self.instance_id)
        self._stop_recovery()
        with self._lock:
            if self._stopped:
                return
        self._set_role()

    def _stop_recovery(self) -> None:
        with self._lock:
            loop, self.recovery = self.recovery, None
        if loop is not None:
            loop.stop()

    def _set_role(self) -> None:
        """Advertise the role this instance has now (``role=leader|standby``; the console picks
        the leader by it), read from the election at the time (``ServiceRuntime.advertise``
        serialises racing callbacks and keeps it for a first registration)."""
        rt = self.runtime
        if rt is None:
            return
        with self._role_lock:
            rt.advertise(role="leader" if self.election.is_leader else "standby")

    # ------------------------------------------------------------------ refusing as a standby
    def refusal(self) -> Unavailable:
        try:
            leader = self.election.leader()
        except MicrocoError:
            leader = None
        if not leader:
            where = "no leader is elected yet (a fail-over is under way: retry in a few seconds)"
        else:
            addr = next((r.address for r in discover(self.kv, ELECTION) if r.instance_id == leader), "")
            where = f"the leader is {leader}" + (f" at {addr}" if addr else " (not registered yet)")
        return Unavailable(f"store coordinator {self.instance_id} {NOT_LEADER}; {where}")

    def check(self) -> None:
        if not self.election.is_leader:
            raise self.refusal()

    def guard(self, servicer: Any) -> Any:
        """Make every coordinator RPC of ``servicer`` refuse unless this instance leads (checked
        before the handler reads anything of the request)."""
        for name in RPCS:
            method = getattr(servicer, name)

            @functools.wraps(method)
            def only_leader(request: Any, context: Any, _method: Any = method) -> Any:
                self.check()
                return _method(request, context)

            setattr(servicer, name, only_leader)
        return servicer
