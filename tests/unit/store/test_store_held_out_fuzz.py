"""Random SQL in the manner of SQLancer and SQLsmith (session 41, held out): queries drawn from a
typed grammar, each answer compared with DuckDB's on the same data, and SQLancer's ternary logic
partitioning on the store alone (``benchmarks/store_sqlfuzz.py``). Shapes found wrong there are
kept here, written small; each failed before its fix."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from microco.benchmarks import store_sqlfuzz
from microco.clients.store import parse_partitioning
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore, spec_from_pb

N = 600
# decimal literals whose nearest double Arrow's decimal-to-double cast misses by an ulp
ULP_OFF = [
    "-0.13446586419",
    "3916.65733536887",
    "372967.7083581596",
    "8.443771249398",
    "-75822.00803883871",
    "-78.41374758118",
    "-0.258954666709",
    "406764.177207672",
]
T = pa.table(
    {
        "id": pa.array(range(N), pa.int64()),
        "k": pa.array([i % 40 - 5 for i in range(N)], pa.int64()),
        "s": pa.array([["1", "01", " 1", "1.0", "2", "+1"][i % 6] for i in range(N)], pa.string()),
        "m": pa.array([i % 50 for i in range(N)], pa.decimal128(12, 2)),
        "v": pa.array([float(ULP_OFF[i % 8]) if i % 3 == 0 else i / 7 for i in range(N)], pa.float64()),
    }
)


def _cluster(tmp_path, layout: list[str]) -> tuple[StoreCore, duckdb.DuckDBPyConnection]:
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(4)])
    core = StoreCore(MemoryKV(), tr, recovery_rate_bytes=0)
    core.create_table("t", T.schema, [spec_from_pb(parse_partitioning(p)) for p in layout])
    core.append("t", T)
    con = duckdb.connect()
    con.register("t", T)
    return core, con


def _same(core: StoreCore, con: duckdb.DuckDBPyConnection, sql: str) -> None:
    got = core.sql(sql)[0]
    want = con.sql(sql).to_arrow_table()
    assert sorted(got.to_pylist(), key=repr) == sorted(want.to_pylist(), key=repr), sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) AS n FROM t WHERE id < 300.00000000000000001",
        "SELECT count(*) AS n FROM t WHERE id < 300 + 0.00000000000000001",
        "SELECT count(*) AS n FROM t WHERE 300.00000000000000001 > id",
    ],
)
def test_a_decimal_literal_prunes_a_range_key_exactly(tmp_path, sql):
    """DuckDB reads ``300.00000000000000001`` as DECIMAL(20,17), which id 300 is below; the
    planner took it for the float 300.0 and pruned away the partition starting at 300: 300 rows
    for DuckDB's 301, silently."""
    core, con = _cluster(tmp_path, ["id:range:300,450", "k:hash:4", "s:hash:3"])
    _same(core, con, sql)


@pytest.mark.parametrize("sql", ["SELECT id, s FROM t WHERE s = 1", "SELECT id, s FROM t WHERE s IN (1, 2)"])
def test_a_string_key_compared_with_a_number_is_not_pruned(tmp_path, sql):
    """DuckDB casts a string column to the number it is compared with (``'01' = 1`` holds); the
    planner cast the number to a string and pruned to the partition of ``'1'``, losing the rows
    of ``'01'``, ``' 1'`` and ``'1.0'`` held elsewhere, silently."""
    core, con = _cluster(tmp_path, ["s:hash:4", "k:hash:4", "id:range:300"])
    _same(core, con, sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) AS n FROM t WHERE k = 3.5",
        "SELECT count(*) AS n FROM t WHERE k IN (3.5, 4)",
        "SELECT count(*) AS n FROM t WHERE k = 9223372036854775808",
        "SELECT count(*) AS n FROM t WHERE k = ' 3'",
        "SELECT count(*) AS n FROM t WHERE id < 300.5",
        "SELECT count(*) AS n FROM t WHERE id BETWEEN 299.5 AND 300.5",
        "SELECT count(*) AS n FROM t WHERE id < 1e30",
        "SELECT count(*) AS n FROM t WHERE m < 1.005 AND k < 100",
        "SELECT count(*) AS n FROM t WHERE m < 1.005e0",
        "SELECT count(*) AS n FROM t WHERE k = 3e0 + 0.5",
    ],
)
def test_a_literal_a_partition_key_cannot_hold_is_answered(tmp_path, sql):
    """A literal of another type than the key's, that the key's type does not hold exactly, on a
    hash or range partition key: the query failed at planning ("literal [3.5] does not fit a
    column of type int64"), where DuckDB answers it."""
    core, con = _cluster(tmp_path, ["id:range:300,450", "k:hash:4", "m:range:1,20"])
    _same(core, con, sql)
    core2, con2 = _cluster(tmp_path / "hash", ["k:hash:3", "m:hash:4", "id:hash:2"])
    _same(core2, con2, sql)


def test_a_decimal_literal_prunes_a_float_key_as_its_nearest_double(tmp_path):
    """DuckDB compares a DOUBLE column with the DECIMAL literal ``372967.7083581596`` as the
    double nearest it; kept exact, the literal was cast to a double by Arrow, an ulp off for
    these, and hashed to another partition than the rows equal to it."""
    core, con = _cluster(tmp_path, ["v:hash:4", "k:hash:4", "id:range:300"])
    _same(core, con, f"SELECT count(*) AS n FROM t WHERE v IN ({', '.join(ULP_OFF)})")
    for lit in ULP_OFF:
        _same(core, con, f"SELECT count(*) AS n FROM t WHERE v = {lit}")


@pytest.mark.parametrize(("layout", "kill"), [("matched", False), ("off-keys", True)])
def test_the_random_sql_runner_finds_no_difference(tmp_path, layout, kill):
    """The benchmark's generator and both oracles, a small seeded sample in process (a node
    killed after the load in the second): every answer DuckDB's, every TLP partition adding up."""
    res = store_sqlfuzz.run(store_sqlfuzz.InProcess(str(tmp_path)), 5, layout, 30, 15, kill)
    assert res["queries"] > 20 and res["tlp"] > 10
    assert not res["findings"], res["findings"]
    assert res["equal"] == res["queries"] and res["tlp_equal"] == res["tlp"]
