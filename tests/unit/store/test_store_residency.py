"""The planner knows which replica's extents are in memory on their nodes (docs/store.md,
"Replicas in memory"): nodes report their extents' page-cache residency (mincore) and their extent
cache's decoded columns; the coordinator's replica choice weighs the bytes a read takes from disk
with its decoding, where the query does not tell the replicas apart, and EXPLAIN says why."""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from microco.services.store import Agg, Query, StoreCore
from microco.services.store._planner import plan_query
from microco.services.store._residency import ExtentResidency, Residency, cached_bytes, resident_pages
from tests.unit.store.test_store_codecs import (  # one small table, every replica zstd unless told
    DATA,
    NODES,
    _core,
)

RNG = np.random.default_rng(5)
UNKEYED_SQL = "select sum(v) as total, count(*) as n from t where s = 'beta'"


def _only_in_memory(core: StoreCore, replica: int) -> Residency:
    """The nodes' real answer, with every extent of the other replicas out of the page cache and
    of the extent cache (what a cold node holds for them): the planner's input, set."""
    core.residency_max_age_s = 3600.0  # (on: off by default since 2026-12-04)
    real = core.residency(["t"], core.live_nodes())
    assert real is not None and real.nodes == len(NODES)
    out = Residency()
    out.groups, out.nodes, out.asked = real.groups, real.nodes, real.asked
    rep = {e.id: e.replica for e in core.table("t").extents()}
    for eid, r in real.extents.items():
        if rep[eid] == replica:
            cols = {c: (b, b) for c, (b, _) in (r.columns or {}).items()}
            out.extents[eid] = replace(r, resident=r.size, columns=cols or None)
        else:
            cols = {c: (b, 0) for c, (b, _) in (r.columns or {}).items()}
            out.extents[eid] = ExtentResidency(r.size, 0, cols or None, {})
    return out


def _seed(core: StoreCore, snap: Residency) -> None:
    """The coordinator plans on ``snap`` as its nodes' latest answer (kept an hour)."""
    core.residency_max_age_s = 3600.0
    core._residency["t"] = (time.monotonic(), snap)


def test_the_planner_prefers_the_replica_in_memory_when_costs_say_so(tmp_path):
    core, _tr = _core(tmp_path)
    tables = {"t": core.table("t")}
    live = [n.name for n in NODES]
    addresses = {n.name: "" for n in NODES}
    q = Query("t", where=(("v", ">", 100),), aggs=(Agg("sum", "v", "total"),))
    # whichever replica alone is in memory is read (all three zstd: nothing else tells them apart)
    for r in (0, 1, 2):
        plan = plan_query(q, tables, live, addresses, resident=_only_in_memory(core, r))
        assert plan.replicas == {"t": r}
        text = plan.explain_text()
        assert "in memory" in text and "from disk" in text and "the one cheapest to read" in text
    # SQL: the one split table's replica, by its read's seconds
    _seed(core, _only_in_memory(core, 2))
    plan = core.explain_sql(UNKEYED_SQL)
    assert plan.replicas == {"t": 2}
    assert "100% in memory" in plan.explain_text() and "0% in memory" in plan.explain_text()
    assert "residency: 6 of 6 nodes said what of the tables is in memory" in plan.explain_text()
    got, _ = core.sql(UNKEYED_SQL)
    want = DATA.filter(pa.compute.equal(DATA["s"], "beta"))
    assert got.to_pylist() == [{"total": pa.compute.sum(want["v"]).as_py(), "n": want.num_rows}]
    # a gathered table (an outer join's sides): the cheapest to read and move
    _seed(core, _only_in_memory(core, 1))
    plan = core.explain_sql("select a.k, b.v from t a left join t b on a.k = b.v where a.g = 3")
    assert set(plan.replicas.values()) <= {0, 1}


def test_a_matched_replica_stays_when_another_is_in_memory(tmp_path):
    core, _tr = _core(tmp_path)
    tables = {"t": core.table("t")}
    live = [n.name for n in NODES]
    addresses = {n.name: "" for n in NODES}
    only_1 = _only_in_memory(core, 1)
    # a group-by on replica 0's partition column: shuffle-free there, whatever is in memory
    q = Query("t", group_by=("k",), aggs=(Agg("sum", "v", "total"),))
    plan = plan_query(q, tables, live, addresses, resident=only_1)
    assert plan.replicas == {"t": 0} and plan.kind == "agg_local"
    # a filter on replica 2's partition column prunes there
    q = Query("t", where=(("v", "=", 7),), aggs=(Agg("sum", "k", "total"),))
    assert plan_query(q, tables, live, addresses, resident=only_1).replicas == {"t": 2}
    _seed(core, only_1)
    assert core.explain_sql("select k, sum(v) from t group by k").replicas == {"t": 0}
    assert core.explain_sql("select sum(k) from t where v = 7").replicas == {"t": 2}


def test_memory_does_not_trade_decoding_across_codecs(tmp_path):
    """A zstd replica in memory is not preferred to an lz4 one on disk: measured at scale factor
    10, that trade lost (docs/store.md, "Replicas in memory"); the decoding decides, as before."""
    core, _tr = _core(tmp_path, ["zstd", "zstd", "lz4"])
    tables = {"t": core.table("t")}
    live = [n.name for n in NODES]
    q = Query("t", where=(("v", ">", 100),), aggs=(Agg("sum", "v", "total"),))
    plan = plan_query(q, tables, live, {n: "" for n in live}, resident=_only_in_memory(core, 0))
    assert plan.replicas == {"t": 2}
    _seed(core, _only_in_memory(core, 1))
    assert core.explain_sql(UNKEYED_SQL).replicas == {"t": 2}
    # with the lz4 replica in memory too, of the two zstd ones the one in memory would be read
    # were the lz4 one unavailable; here the lz4 one decodes least and stays
    _seed(core, _only_in_memory(core, 2))
    assert core.explain_sql(UNKEYED_SQL).replicas == {"t": 2}


def test_a_plan_cached_while_one_replica_was_in_memory_is_not_reused_when_another_is(tmp_path):
    core, _tr = _core(tmp_path)
    _seed(core, _only_in_memory(core, 1))
    assert core.explain_sql(UNKEYED_SQL).replicas == {"t": 1}
    assert core.explain_sql(UNKEYED_SQL).cached
    _seed(core, _only_in_memory(core, 2))
    plan = core.explain_sql(UNKEYED_SQL)
    assert plan.replicas == {"t": 2} and not plan.cached
    q = Query("t", aggs=(Agg("sum", "v", "total"),))
    assert core.plan(q).replicas == {"t": 2}
    _seed(core, _only_in_memory(core, 1))
    assert core.plan(q).replicas == {"t": 1}


def test_off_plans_as_before(tmp_path):
    core, _tr = _core(tmp_path)
    _seed(core, _only_in_memory(core, 2))
    core.residency_max_age_s = None
    assert core.residency(["t"], core.live_nodes()) is None
    assert core.explain_sql(UNKEYED_SQL).replicas == {"t": 0}


def _evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_nodes_report_the_page_cache_and_their_decoded_columns(tmp_path):
    core, tr = _core(tmp_path)
    e = next(x for x in core.table("t").extents() if x.replica == 0)
    store = tr.stores[e.node]
    path = store.path("t", e.id)
    rec = store.residency(["t"])["tables"]["t"]
    assert rec["columns"] == ["k", "g", "v", "s"]
    size, resident, col_bytes, col_resident, decoded = rec["extents"][e.id]
    assert size == path.stat().st_size and 0 <= resident <= size
    assert (
        len(col_bytes) == 4
        and sum(col_bytes) < size
        and all(0 <= r <= b for r, b in zip(col_resident, col_bytes))
    )
    assert decoded == {}
    # the extent cache: the columns a read decoded, for every batch
    store.read("t", e.id, columns=["v", "s"], checksum=e.checksum)
    decoded = store.residency(["t"])["tables"]["t"]["extents"][e.id][4]
    assert decoded == {"v": 1.0, "s": 1.0}
    # the page cache: an evicted file reads as out of it, and a column's range in it once read
    # (where the file system can evict: not a tmpfs); columns of 200,000 rows, pages apart
    from microco.services.store._nodestore import NodeStore

    big = pa.table({c: RNG.integers(0, 1 << 40, 200_000) for c in ("a", "b", "c")})
    node = NodeStore("solo", tmp_path / "solo")
    node.put_extent("u", "s000001-r0-p0000-x", big, [[0, 0, big.num_rows]])
    cold_path = node.path("u", "s000001-r0-p0000-x")
    node.residency(["u"])  # its column ranges read from its header once, and kept
    _evict(cold_path)
    pages = resident_pages(cold_path)
    if pages is None or pages.any():
        pytest.skip("this file system keeps the file's pages in memory")
    rec = node.residency(["u"])["tables"]["u"]["extents"]["s000001-r0-p0000-x"]
    assert rec[1] == 0 and rec[3] == [0, 0, 0] and min(rec[2]) > 3 * 4096
    node.read("u", "s000001-r0-p0000-x", columns=["b"])
    rec = node.residency(["u"])["tables"]["u"]["extents"]["s000001-r0-p0000-x"]
    assert rec[3][1] == rec[2][1]  # "b" read whole
    assert rec[3][0] < rec[2][0] / 2 and rec[3][2] < rec[2][2] / 2  # the others mostly not
    # cachestat(2) (what a node asks where the kernel has it) and mincore(2) agree
    size = cold_path.stat().st_size
    fd = os.open(cold_path, os.O_RDONLY)
    try:
        by_cachestat = cached_bytes(fd, [(0, size)])
    finally:
        os.close(fd)
    by_mincore = int(resident_pages(cold_path).sum()) * mmap.PAGESIZE
    assert by_cachestat is None or by_cachestat[0] == min(by_mincore, size)
    # the coordinator's estimate: the disk bytes of the columns read that are not in memory
    snap = Residency()
    snap.merge(
        {
            "tables": {
                "t": {
                    "columns": ["k", "g", "v", "s"],
                    "extents": {e.id: [size, 0, col_bytes, [0] * 4, {"v": 1.0}]},
                }
            }
        }
    )
    assert snap.get(e.id).disk_bytes(["k", "v"]) == col_bytes[0]  # "v" is held decoded


def test_the_extent_cache_counts_only_for_reads_that_fit_in_it(tmp_path):
    from microco.services.store._planner import read_estimate, replica_units

    core, tr = _core(tmp_path)
    t = core.table("t")
    live = {n.name for n in NODES}
    units = replica_units(t, 0, live, {n: "" for n in live})
    snap = _only_in_memory(core, 0)
    for eid, r in list(snap.extents.items()):
        snap.extents[eid] = replace(r, decoded={c: 1.0 for c in DATA.schema.names})
    answer = tr.stores["n0"].residency(["t"])
    assert answer["cache_bytes"] == tr.stores["n0"].cache_bytes
    snap.cache_bytes = {n.name: 1 << 30 for n in NODES}
    held = read_estimate(t, units, ["v", "s"], snap)
    assert held.todo_s == 0 and held.decode_s > 0
    snap.cache_bytes = {n.name: 1000 for n in NODES}  # smaller than any node's read: evicted as read
    spilled = read_estimate(t, units, ["v", "s"], snap)
    assert spilled.todo_s == pytest.approx(spilled.decode_s)


def test_the_coordinator_does_not_ask_by_default(tmp_path):
    """Off by default since 2026-12-04 (docs/store.md, "Replicas in memory": at scale factor 1,
    all replicas zstd, it changed no replica choice and cost ~5% geomean): a query asks no node
    what is in memory and EXPLAIN has no ``residency:`` line; on, it asks."""
    import argparse

    from microco.services.store._service import _coordinator_args

    core, _tr = _core(tmp_path)
    plan = core.explain_sql(UNKEYED_SQL)
    assert core.residency_asks == 0 and "residency:" not in plan.explain_text()
    parser = argparse.ArgumentParser()
    _coordinator_args(parser)
    assert parser.parse_args([]).residency_max_age_s < 0  # the coordinator's flag: never
    core.residency_max_age_s = 1.0
    plan = core.explain_sql(UNKEYED_SQL.replace("beta", "gamma"))
    assert core.residency_asks == 1 and "residency:" in plan.explain_text()
