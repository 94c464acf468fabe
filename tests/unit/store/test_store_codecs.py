"""A codec per replica: a table's layout choice carried in its catalog record, honoured by every
writer of the replica's extents (appends, recovery's rebuilds, a recode), and weighed by the
planner, which sends a read no replica's partitioning matches to the replica cheapest to decode."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from microco.clients.store._client import parse_partitioning
from microco.common.errors import FailedPrecondition, InvalidArgument
from microco.common.kv import MemoryKV
from microco.services.store import Agg, LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore
from microco.services.store._layout import open_extent

N = 12_000
RNG = np.random.default_rng(11)
DATA = pa.table(
    {
        "k": np.arange(N, dtype=np.int64),
        "g": RNG.integers(0, 50, N),
        "v": RNG.integers(0, 1000, N),
        "s": pa.array(RNG.choice(["alpha", "beta", "gamma"], N)),
    }
)
SPECS = [PartitionSpec("k", "hash", 4), PartitionSpec("g", "hash", 4), PartitionSpec("v", "hash", 3)]
NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
SUM_SQL = "select sum(v) as total, count(*) as n from t where v > 100"


def _core(tmp_path, codecs=None) -> tuple[StoreCore, LocalTransport]:
    tr = LocalTransport(str(tmp_path), NODES)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=3000, recovery_rate_bytes=0)
    core.create_table("t", DATA.schema, SPECS, codecs=codecs)
    core.append("t", DATA)
    return core, tr


def _file_codec(tr: LocalTransport, node: str, extent_id: str) -> str:
    return open_extent(tr.stores[node].path("t", extent_id)).codec


def _codecs_by_replica(core: StoreCore, tr: LocalTransport) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for e in core.table("t").extents():
        out.setdefault(e.replica, set()).add(_file_codec(tr, e.node, e.id))
    return out


def _expected(sql: str) -> list[tuple]:
    con = duckdb.connect()
    con.register("t", DATA)
    return con.sql(sql).fetchall()


def test_one_lz4_replica_writes_its_extents_in_lz4_and_the_others_in_zstd(tmp_path):
    core, tr = _core(tmp_path, ["zstd", "lz4", "zstd"])
    assert core.table("t").codecs == ["zstd", "lz4", "zstd"]
    assert _codecs_by_replica(core, tr) == {0: {"zstd"}, 1: {"lz4"}, 2: {"zstd"}}
    assert {e.codec for e in core.table("t").extents() if e.replica == 1} == {"lz4"}
    # a table created without codecs: its record has none, every replica the node's default
    plain, tr2 = _core(tmp_path / "plain")
    assert "replica_codecs" not in plain.catalog.table_record("t")[0]
    assert _codecs_by_replica(plain, tr2) == {0: {"zstd"}, 1: {"zstd"}, 2: {"zstd"}}


def test_a_rebuilt_extent_keeps_its_replicas_codec(tmp_path):
    core, tr = _core(tmp_path, ["zstd", "lz4", "zstd"])
    victim = next(e.node for e in core.table("t").extents() if e.replica == 1)
    lost = {e.id for e in core.table("t").extents() if e.node == victim}
    tr.kill(victim)
    rep = core.recover()
    assert rep["rebuilt"] == len(lost) and core.lost_count() == 0
    rebuilt = [e for e in core.table("t").extents() if e.id not in lost and e.node != victim]
    assert _codecs_by_replica(core, tr) == {0: {"zstd"}, 1: {"lz4"}, 2: {"zstd"}}
    assert any(e.replica == 1 for e in core.table("t").extents() if e.id not in lost) and rebuilt
    got, _ = core.sql(SUM_SQL)
    assert [tuple(r.values()) for r in got.to_pylist()] == _expected(SUM_SQL)


def test_recode_switches_a_replica_and_queries_stay_correct(tmp_path):
    core, tr = _core(tmp_path)
    before = {e.id for e in core.table("t").extents() if e.replica == 2}
    sql = "select g, sum(v) as sv, count(distinct s) as ns from t group by g order by g"
    expected = _expected(sql)
    rep = core.recode("t", 2, "lz4", background=False)
    assert rep["state"] == "done" and rep["recoded"] == len(before) and not rep["errors"]
    assert core.recode_progress("t")["state"] == "done"
    assert core.table("t").codecs == ["", "", "lz4"]
    assert _codecs_by_replica(core, tr) == {0: {"zstd"}, 1: {"zstd"}, 2: {"lz4"}}
    after = {e.id for e in core.table("t").extents() if e.replica == 2}
    assert not before & after  # new extents, switched in the catalog
    for e in core.table("t").extents():  # the old files are gone, the new ones verified
        assert sorted(p.stem for p in tr.stores[e.node].path("t", e.id).parent.glob("*.arrow")) == sorted(
            x.id for x in core.table("t").extents() if x.node == e.node
        )
    for r in range(3):
        got, _ = core.query(Query("t", group_by=("g",), aggs=(Agg("sum", "v", "sv"),), replica=r))
        assert sorted(got.to_pylist(), key=lambda x: x["g"]) == [
            {"g": g, "sv": sv} for g, sv, _ns in expected
        ]
    got, _ = core.sql(sql)
    assert [tuple(r.values()) for r in got.to_pylist()] == expected
    # an append after the recode writes the replica's new codec
    core.append("t", DATA.slice(0, 100))
    assert _codecs_by_replica(core, tr)[2] == {"lz4"}
    # nothing left to recode: a second run rewrites nothing
    assert core.recode("t", 2, "lz4", background=False)["extents"] == 0


def test_a_recode_that_fails_midway_loses_nothing_and_a_rerun_finishes(tmp_path):
    core, tr = _core(tmp_path)
    sql = "select g, sum(v) as sv from t group by g order by g"
    expected = _expected(sql)
    todo = [e for e in core.table("t").extents() if e.replica == 1]
    victim = todo[1].node
    calls = {"n": 0}
    real = tr.action

    def dies_on_the_third_rewrite(node, name, body):
        if name == "rebuild":
            calls["n"] += 1
            if calls["n"] == 3:
                tr.kill(victim)  # a node dies in the middle of the recode
                raise ConnectionError("node lost mid-rewrite")
        return real(node, name, body)

    tr.action = dies_on_the_third_rewrite  # type: ignore[method-assign]
    rep = core.recode("t", 1, "lz4", background=False)
    tr.action = real  # type: ignore[method-assign]
    assert rep["state"] == "partial" and rep["errors"]
    # every row still readable (degraded where the dead node held extents), the answer exact
    got, _ = core.sql(sql)
    assert [tuple(r.values()) for r in got.to_pylist()] == expected
    tr.dead.discard(victim)  # the node comes back with its files
    rep = core.recode("t", 1, "lz4", background=False)
    assert rep["state"] == "done", rep
    assert _codecs_by_replica(core, tr)[1] == {"lz4"}
    got, _ = core.sql(sql)
    assert [tuple(r.values()) for r in got.to_pylist()] == expected


def test_one_recode_at_a_time(tmp_path):
    core, _tr = _core(tmp_path)
    core._recode_lock.acquire()
    try:
        with pytest.raises(FailedPrecondition, match="another recode is running"):
            core.recode("t", 0, "lz4", background=False)
    finally:
        core._recode_lock.release()


def test_an_unkeyed_scan_goes_to_the_lz4_replica_and_explain_shows_why(tmp_path):
    core, _tr = _core(tmp_path, ["zstd", "zstd", "lz4"])
    plan = core.explain_sql(SUM_SQL)
    assert plan.replicas == {"t": 2}
    text = plan.explain_text()
    assert "decoding" in text and "lz4" in text and "replica 0" in text
    got, _ = core.sql(SUM_SQL)
    assert [tuple(r.values()) for r in got.to_pylist()] == _expected(SUM_SQL)
    # the JSON model's planner too: a global aggregate with no partition affinity
    p = core.plan(Query("t", where=(("v", ">", 100),), aggs=(Agg("sum", "v", "total"),)))
    assert p.replicas == {"t": 2}
    assert "lz4" in p.explain_text() and "CPU s decoding" in p.explain_text()
    # affinity still wins over decoding: a group-by on replica 1's column stays on replica 1
    keyed = core.explain_sql("select g, sum(v) from t group by g")
    assert keyed.replicas == {"t": 1}
    p = core.plan(Query("t", group_by=("g",), aggs=(Agg("sum", "v", "total"),)))
    assert p.replicas == {"t": 1} and p.kind == "agg_local"


def test_all_zstd_tables_plan_as_before(tmp_path):
    core, _tr = _core(tmp_path)
    assert core.explain_sql(SUM_SQL).replicas == {"t": 0}  # ties: the lower replica, as before
    assert core.plan(Query("t", aggs=(Agg("sum", "v", "total"),))).replicas == {"t": 0}


@pytest.mark.parametrize(
    ("codecs", "match"),
    [
        (["zstd", "gzip", "zstd"], "unknown extent codec 'gzip': one of zstd, lz4, none"),
        (["zstd", "lz4"], "give a codec for each"),
    ],
)
def test_bad_codecs_are_clear_errors(tmp_path, codecs, match):
    core = StoreCore(MemoryKV(), LocalTransport(str(tmp_path), NODES))
    with pytest.raises(InvalidArgument, match=match):
        core.create_table("t", DATA.schema, SPECS, codecs=codecs)
    assert core.catalog.table_names() == []


def test_bad_codec_names_elsewhere_are_clear_errors(tmp_path):
    core, tr = _core(tmp_path)
    with pytest.raises(InvalidArgument, match="unknown extent codec 'snappy'"):
        core.recode("t", 1, "snappy", background=False)
    with pytest.raises(InvalidArgument, match="replica must be 0, 1 or 2"):
        core.recode("t", 3, "lz4", background=False)
    assert core.table("t").codecs == ["", "", ""]
    with pytest.raises(InvalidArgument, match="unknown extent codec 'brotli'"):
        parse_partitioning("k:hash:8@brotli")
    assert parse_partitioning("k:hash:8@lz4").codec == "lz4"
    assert parse_partitioning("d:range:1994-01-01,1996-01-01@none").range_bounds == [
        "1994-01-01",
        "1996-01-01",
    ]
    with pytest.raises(InvalidArgument, match="unknown extent codec 'zip'"):
        tr.stores["n0"].put_extent("t", "x", DATA.slice(0, 10), [[0, 0, 10]], codec="zip")


def test_the_benchmark_takes_codecs_per_replica_and_defaults_to_none():
    import argparse

    from microco.benchmarks.store import REPLICA_CODECS, parse_replica_codecs

    assert REPLICA_CODECS == {}  # the default: zstd for every replica, no table singled out
    assert parse_replica_codecs("lineitem=zstd,lz4,zstd") == ("lineitem", ["zstd", "lz4", "zstd"])
    for bad, match in (("lineitem=zstd,lz4", "one per replica"), ("lineitem=zstd,gz,zstd", "'gz'")):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            parse_replica_codecs(bad)


def test_a_gathered_table_reads_the_cheapest_replica_but_never_more_bytes_for_a_faster_codec(tmp_path):
    from microco.services.store._planner import cheapest_replica

    core, tr = _core(tmp_path, ["zstd", "zstd", "lz4"])
    t = core.table("t")
    live = {n.name for n in tr.live_nodes()}
    r, cost, _units, _allowed = cheapest_replica(t, [], ["v", "s"], live, {})
    assert r == 2 and "lz4" in cost.describe()
    # a filter on replica 0's key prunes it to one partition of four: the lz4 replica would read
    # (and move) four times the bytes, which its faster decoding does not pay for
    r, cost, _units, allowed = cheapest_replica(t, [("k", "=", 5)], ["v", "s"], live, {})
    assert r == 0 and allowed is not None and len(allowed) == 1


def test_a_recode_whose_coordinator_died_reads_as_interrupted_and_a_rerun_finishes(tmp_path):
    core, tr = _core(tmp_path)
    rep = core.recode("t", 0, "lz4", background=False)
    assert rep["state"] == "done"
    # a coordinator that died mid-recode left its record "running"; another one reads it
    core.kv.put_json("/microco/store/recode/t", {**rep, "state": "running", "codec": "none"})
    core.catalog.set_replica_codec("t", 0, "none")
    other = StoreCore(core.kv, tr, super_extent_rows=3000, recovery_rate_bytes=0)
    assert other.recode_progress("t")["state"] == "interrupted"
    assert other.recode("t", 0, "none", background=False)["state"] == "done"
    assert _codecs_by_replica(other, tr)[0] == {"none"}


def test_the_nodes_say_which_replica_serves_the_reads(tmp_path):
    core, _tr = _core(tmp_path, ["zstd", "zstd", "lz4"])
    core.sql(SUM_SQL)  # unkeyed: the lz4 replica
    core.sql("select g, count(*) from t group by g")  # keyed: replica 1
    totals = [0, 0, 0]
    for n in core.nodes():
        for r, b in enumerate(n["read_by_replica"].get("t", [0, 0, 0])):
            totals[r] += b
    assert totals[0] == 0 and totals[1] > 0 and totals[2] > 0
