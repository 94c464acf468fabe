"""``StoreClient.read``'s parallel read of a table's Flight endpoints, and what it does when a
node fails or stops answering half-way.

A read is planned by the coordinator (``PlanRead``: one endpoint per node, each a ticket for that
node's extents) and then read straight from the nodes. A node killed mid-read resets its
connections; one that stops answering without a reset (a hung process, a host that lost power or
its network) held the read to the call's deadline: 20 s to connect, or 120 s once streaming,
and then failed it (measured with a node SIGSTOPped, session 28). The coordinator stops planning
on a node once its lease lapses, so the client:

* while endpoints are still being read, after ``WATCH_AFTER_S`` and then every ``WATCH_EVERY_S``,
  asks for the plan again: a pending endpoint's node that the new plan no longer uses has left
  the cluster, so its reads are cancelled (those still waiting for a first message cannot be:
  their threads are daemons, left to their deadline) and the read starts over on the new plan;
* on ``Unavailable`` from a node, plans again until the plan no longer uses it (at most
  ``LOST_WAIT_S``: a node back by then is read again) and starts over, at most ``ATTEMPTS``
  plans in all.

Starting over reads the new plan whole: the parts already read came from the old plan's extents,
and a plan is one consistent snapshot of the table, so parts of two plans are never mixed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from microco.common.errors import Unavailable

from ._flight import FlightClients

ATTEMPTS = 4  # plans a read may take: a loss in each of three, then give up
WATCH_AFTER_S = 1.0  # a read shorter than this is never re-planned while it runs
WATCH_EVERY_S = 1.0  # how often a longer read asks whether its nodes are still planned
LOST_WAIT_S = 30.0  # how long to wait for the coordinator to stop planning on a failed node
MAX_STREAMS = 8


class NodeLost(Exception):
    """A node of the plan failed or left the cluster while its endpoint was read."""

    def __init__(self, address: str, cause: BaseException | None = None) -> None:
        super().__init__(address)
        self.address = address
        self.cause = cause


def read_endpoints(
    endpoints: Sequence[Any],
    replan: Callable[[], Any],
    ident: Any = None,
) -> list[pa.Table]:
    """The tables of ``endpoints`` (``.address``, ``.ticket``), read in parallel; raises
    ``NodeLost`` when one fails with ``Unavailable`` or when ``replan()`` (a fresh plan) no
    longer uses the node of one still being read."""
    clients = FlightClients(ident=ident)
    done: queue.Queue[tuple[int, pa.Table | None, BaseException | None]] = queue.Queue()
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(endpoints)):
        todo.put(i)

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            ep = endpoints[i]
            try:
                done.put((i, clients.do_get(ep.address, ep.ticket), None))
            except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
                done.put((i, None, exc))

    # daemons: a call waiting on a node that stopped answering cannot be cancelled, and must
    # not hold the process (a ThreadPoolExecutor's threads are joined at exit)
    for _ in range(max(1, min(MAX_STREAMS, len(endpoints)))):
        threading.Thread(target=worker, name="store-read", daemon=True).start()
    parts: dict[int, pa.Table] = {}
    started = time.monotonic()
    next_watch = started + WATCH_AFTER_S
    try:
        while len(parts) < len(endpoints):
            try:
                i, table, exc = done.get(timeout=max(0.01, next_watch - time.monotonic()))
            except queue.Empty:
                pending = {endpoints[i].address for i in range(len(endpoints)) if i not in parts}
                planned = {ep.address for ep in replan().endpoints}
                gone = sorted(pending - planned)
                if gone:
                    for address in gone:
                        clients.abort(address)
                    raise NodeLost(gone[0]) from None
                next_watch = time.monotonic() + WATCH_EVERY_S
                continue
            if exc is not None:
                if isinstance(exc, Unavailable):
                    raise NodeLost(endpoints[i].address, exc) from exc
                raise exc
            assert table is not None
            parts[i] = table
    finally:
        clients.close()
    return [parts[i] for i in range(len(endpoints))]


def read_planned(
    plan: Callable[[], Any],
    schema_of: Callable[[Any], pa.Schema],
    ident: Any = None,
) -> pa.Table:
    """Plan, read every endpoint, and start over on a new plan when a node is lost (above)."""
    lost: NodeLost | None = None
    for _ in range(ATTEMPTS):
        p = plan()
        if lost is not None:
            waited_until = time.monotonic() + LOST_WAIT_S
            while lost.address in {ep.address for ep in p.endpoints} and time.monotonic() < waited_until:
                time.sleep(0.5)
                p = plan()
        schema = schema_of(p)
        try:
            parts = read_endpoints(p.endpoints, plan, ident)
        except NodeLost as exc:
            lost = exc
            continue
        kept = [t.select(schema.names) for t in parts if t.num_rows]
        return pa.concat_tables(kept) if kept else schema.empty_table()
    assert lost is not None
    if isinstance(lost.cause, Exception):
        raise lost.cause
    raise Unavailable(f"read: node {lost.address} left the cluster mid-read, {ATTEMPTS} plans in a row")
