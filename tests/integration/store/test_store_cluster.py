"""The store as real processes: six store nodes (three fault domains) and a coordinator on a real
etcd, driven through the SDK. Results against DuckDB, the placement invariant row by row from the
nodes' data directories, kill -9 during queries and appends, recovery, corruption, bad input."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from microco.clients.store import StoreClient
from microco.common.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from microco.common.kv import EtcdKV
from microco.common.registry import discover
from microco.services.store import check_row_copies
from microco.services.store._catalog import Catalog
from microco.services.store._layout import read_extent
from microco.services.store._placement import Copy
from microco.services.store._procs import StoreCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODES = [(f"n{i}", f"rack{i % 3}") for i in range(6)]
RNG = np.random.default_rng(3)
N = 4000
ORDERS = pa.table(
    {
        "o_id": np.arange(N, dtype=np.int64),
        "o_cust": RNG.integers(0, 60, N),
        "o_date": pa.array(RNG.integers(8000, 9000, N).astype("int32")).cast(pa.date32()),
        "o_price": np.round(RNG.random(N) * 1000, 2),
        "o_flag": RNG.choice(["A", "B", "C"], N),
    }
)
M = 12000
ITEMS = pa.table(
    {"l_id": np.arange(M, dtype=np.int64), "l_oid": RNG.integers(0, N, M), "l_qty": RNG.integers(1, 50, M)}
)


@pytest.fixture(scope="module")
def cluster(etcd_endpoint, tmp_path_factory):
    kv = EtcdKV(etcd_endpoint)
    kv.delete_prefix("/microco/store/")
    kv.delete_prefix("/microco/services/store")
    kv.close()
    root = tmp_path_factory.mktemp("store")
    c = StoreCluster(
        etcd_endpoint,
        root,
        NODES,
        lease_ttl_s=2,
        coordinator_args=[
            "--recovery-grace-s",
            "0.5",
            "--recovery-interval-s",
            "1",
            "--super-extent-rows",
            "3000",
            "--sort-extents",  # (off by default; sorted extents' recovery is checked here)
        ],
    ).start()
    client = StoreClient.from_address(c.coordinator_address)
    client.create_table(
        "orders", ORDERS.schema, ["o_id:hash:4", "o_cust:hash:4", "o_date:range:1992-01-01,1993-06-01"]
    )
    client.create_table("items", ITEMS.schema, ["l_oid:hash:4", "l_id:hash:3", "l_qty:hash:2"])
    client.append("orders", ORDERS)
    client.append("items", ITEMS)
    yield c, client
    client.close()
    c.stop()


@pytest.fixture()
def fresh(cluster):
    """A client of the coordinator that leads now (the fail-over test kills the first one, and
    should it fail half-way, this waits for a live leader or starts one; items grew in the kill
    test, so the tests after it compare items only with the store's own answers)."""
    c, _ = cluster
    client = StoreClient.from_address(c.wait_leader())
    yield c, client
    client.close()


def duck(sql: str, extra: dict | None = None) -> list[tuple]:
    con = duckdb.connect()
    con.register("orders", ORDERS)
    con.register("items", ITEMS)
    for k, v in (extra or {}).items():
        con.register(k, v)
    return sorted(con.sql(sql).fetchall(), key=repr)


def rows(t: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


def same(a: list[tuple], b: list[tuple]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            if isinstance(u, float) or isinstance(v, float):
                if abs(u - v) > 1e-6 * max(1.0, abs(u)):
                    return False
            elif u != v:
                return False
    return True


QUERIES = [
    (
        lambda c: (
            c.table("orders")
            .group_by("o_cust")
            .agg(s=("sum", "o_price"), n=("count", "*"), m=("mean", "o_price"))
        ),
        "select o_cust, sum(o_price), count(*), avg(o_price) from orders group by o_cust",
    ),
    (
        lambda c: (
            c.table("orders").filter("o_date", ">=", "1993-06-01").group_by("o_flag").agg(n=("count", "*"))
        ),
        "select o_flag, count(*) from orders where o_date >= date '1993-06-01' group by o_flag",
    ),
    (
        lambda c: (
            c.table("orders")
            .join(c.table("items"), "o_id", "l_oid")
            .group_by("o_cust")
            .agg(q=("sum", "l_qty"))
        ),
        "select o_cust, sum(l_qty) from orders join items on o_id = l_oid group by o_cust",
    ),
    (
        lambda c: c.table("orders").select("o_id", "o_price").filter("o_cust", "=", 7),
        "select o_id, o_price from orders where o_cust = 7",
    ),
]


def check_queries(client: StoreClient, queries=QUERIES) -> set[str]:
    kinds = set()
    for build, sql in queries:
        want = duck(sql)
        for r in (None, 0, 1, 2):
            f = build(client)
            if r is not None:
                f = f.on_replica(r)
            got = rows(f.collect())
            assert same(got, want), (sql, r, client.last_plan)
            kinds.add(client.last_plan["kind"])
    return kinds


def invariant(cluster: StoreCluster, table: str, key: str, expected: int) -> None:
    kv = EtcdKV(cluster.etcd)
    try:
        info = Catalog(kv).table(table)
    finally:
        kv.close()
    domain = dict(NODES)
    copies = defaultdict(list)
    for e in info.extents():
        t, _ = read_extent(Path(cluster.root) / e.node / "tables" / table / f"{e.id}.arrow")
        for k in t.column(key).to_pylist():
            copies[k].append(Copy(e.replica, e.node, domain[e.node]))
    assert len(copies) == expected
    for k, cs in copies.items():
        assert check_row_copies(cs) is None, (k, cs)


def wait_recovered(client: StoreClient, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = client.recovery()
        if rec["unavailable_extents"] == 0 and rec.get("state") in ("done", "idle"):
            return rec
        time.sleep(0.3)
    raise AssertionError(f"recovery did not finish: {client.recovery()}")


def test_queries_match_duckdb_on_every_replica(fresh):
    c, client = fresh
    kinds = check_queries(client)
    assert {"agg_local", "agg_shuffle", "join_copart", "join_shuffle", "scan"} <= kinds
    got = client.read("orders", where=[["o_cust", "in", [1, 2]]], columns=["o_id", "o_cust"])
    assert same(rows(got), duck("select o_id, o_cust from orders where o_cust in (1, 2)"))
    assert "shuffle-free" in client.table("orders").group_by("o_cust").agg(n=("count", "*")).explain()
    invariant(c, "orders", "o_id", N)
    invariant(c, "items", "l_id", M)
    nodes = client.nodes()
    assert len(nodes) == 6 and all(n["alive"] and n["extents"] > 0 for n in nodes)


def test_bad_input_changes_nothing(fresh):
    _, client = fresh
    before = client.get_table("orders")
    with pytest.raises(InvalidArgument, match="partitioning column 'o_cust'"):
        client.append("orders", ORDERS.drop_columns(["o_cust"]))
    with pytest.raises(InvalidArgument, match="schema mismatch"):
        client.append("orders", ORDERS.append_column("x", pa.array(np.zeros(N))))
    with pytest.raises(NotFound):
        client.append("nope", ORDERS)
    with pytest.raises(NotFound):
        client.table("nope").collect()
    with pytest.raises(InvalidArgument, match="no column 'zz'"):
        client.table("orders").filter("zz", "=", 1).collect()
    with pytest.raises(AlreadyExists):
        client.create_table("orders", ORDERS.schema, ["o_id", "o_cust", "o_price"])
    with pytest.raises(InvalidArgument):
        client.create_table("bad", ORDERS.schema, ["o_id", "o_cust"])
    after = client.get_table("orders")
    assert (before["rows"], before["extents"]) == (after["rows"], after["extents"])
    assert [t["name"] for t in client.list_tables()] == ["items", "orders"]


def test_cli_create_load_query_explain_nodes_recovery(fresh, tmp_path, capsys):
    import pyarrow.csv as pcsv

    from microco.cli import main

    c, client = fresh
    csv = tmp_path / "cust.csv"
    cust = pa.table({"c_id": np.arange(500), "c_nation": np.arange(500) % 25, "c_bal": np.arange(500) * 1.5})
    pcsv.write_csv(cust, csv)
    base = ["store", "--coordinator", c.coordinator_address]
    assert (
        main(
            [
                *base,
                "create",
                "cust",
                "--from",
                str(csv),
                "--replica",
                "c_id",
                "--replica",
                "c_nation:hash:4",
                "--replica",
                "c_bal:range:100,400",
            ]
        )
        == 0
    )
    assert main([*base, "load", "cust", str(csv)]) == 0
    assert "loaded 500 rows" in capsys.readouterr().out
    assert (
        main(
            [
                *base,
                "query",
                "cust",
                "--group-by",
                "c_nation",
                "--agg",
                "sum:c_bal:b",
                "--order-by",
                "b:desc",
                "--limit",
                "2",
                "--format",
                "json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [r["c_nation"] for r in out] == [24, 23]
    assert main([*base, "explain", "cust", "--group-by", "c_nation", "--agg", "count:*"]) == 0
    assert "shuffle-free" in capsys.readouterr().out
    assert main([*base, "nodes", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 6
    assert main([*base, "recovery", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unavailable_extents"] == 0
    assert main([*base, "query", "cust", "--where", "zz = 1"]) == 1
    assert "no column 'zz'" in capsys.readouterr().err
    client.drop_table("cust")


def test_corrupt_extent_detected_and_rebuilt(fresh):
    c, client = fresh
    kv = EtcdKV(c.etcd)
    try:
        e = Catalog(kv).table("orders").super_extents[0].replica(1)[0]
    finally:
        kv.close()
    path = Path(c.root) / e.node / "tables" / "orders" / f"{e.id}.arrow"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    check_queries(client)  # detected on read; answered from the other replicas' buckets
    client.scrub()
    client.start_recovery()
    wait_recovered(client)
    assert client.scrub() == []
    invariant(c, "orders", "o_id", N)
    # an orphan extent file (an interrupted append's, an hour old) is deleted by the scrub over
    # Flight; a young one (an append that may still be in flight) is kept
    tdir = Path(c.root) / e.node / "tables" / "orders"
    old, young = tdir / "s999999-r0-p0000-0badf00d.arrow", tdir / "s999999-r1-p0000-0badf00d.arrow"
    old.write_bytes(b"orphan")
    young.write_bytes(b"young")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    rep = client.scrub(report=True)
    assert rep["orphans_deleted"] == [f"{e.node}:orders/{old.name}"] and rep["orphan_bytes"] == 6
    assert not old.exists() and young.exists()
    young.unlink()
    check_queries(client)


def test_kill9_during_queries_and_append_loses_nothing(fresh):
    c, client = fresh
    more = pa.table(
        {
            "l_id": np.arange(M, M + 30000, dtype=np.int64),
            "l_oid": RNG.integers(0, N, 30000),
            "l_qty": RNG.integers(1, 50, 30000),
        }
    )
    errors: list[BaseException] = []
    stop = threading.Event()
    answered = [0]

    def query_loop():
        qc = StoreClient.from_address(c.coordinator_address)
        want = duck(QUERIES[0][1])
        while not stop.is_set():
            try:
                assert same(rows(QUERIES[0][0](qc).collect()), want)
                answered[0] += 1
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    appended = {}

    def append():
        ac = StoreClient.from_address(c.coordinator_address)
        try:
            appended.update(ac.append("items", more))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    sums = extent_checksums(c, "orders")  # orders: no append during the kill
    assert any(node == "n1" for node, _, _ in sums.values())
    q = threading.Thread(target=query_loop)
    a = threading.Thread(target=append)
    q.start()
    a.start()
    time.sleep(0.3)
    c.kill("n1")
    a.join(60)
    time.sleep(1.0)
    stop.set()
    q.join(60)
    assert not errors, errors
    assert answered[0] > 0 and appended["rows"] == 30000
    c.wait_gone("n1")
    rec = wait_recovered(client)
    assert rec["state"] == "done"
    all_items = pa.concat_tables([ITEMS, more])
    got = rows(client.table("items").agg(n=("count", "*"), s=("sum", "l_qty")).collect())
    assert same(got, [(M + 30000, int(pa.compute.sum(all_items["l_qty"]).as_py()))])
    invariant(c, "orders", "o_id", N)
    invariant(c, "items", "l_id", M + 30000)
    nodes = {n["name"]: n for n in client.nodes()}
    assert not nodes["n1"]["alive"] and nodes["n1"]["extents"] == 0
    # each replica's extents sorted on its partition column (session 38), in a total order: the
    # extents rebuilt from the other replicas' buckets are the lost ones' bytes
    rebuilt = extent_checksums(c, "orders")
    assert rebuilt.keys() == sums.keys()
    assert all(sums[k][2] for k in sums), sums
    assert {k: (sums[k], v) for k, v in rebuilt.items() if v[1:] != sums[k][1:]} == {}
    assert {k for k, v in rebuilt.items() if v[0] != sums[k][0]} == {
        k for k, v in sums.items() if v[0] == "n1"
    }
    check_queries(client, ORDERS_QUERIES)  # (items grew: its queries are checked elsewhere)


def extent_checksums(c: StoreCluster, table: str) -> dict[tuple[int, int, int], tuple[str, str, str]]:
    """Per (super-extent, replica, partition): the node, checksum and sorted column in the catalog."""
    kv = EtcdKV(c.etcd)
    try:
        info = Catalog(kv).table(table)
        return {
            (s.id, e.replica, e.partition): (e.node, e.checksum, e.sorted)
            for s in info.super_extents
            for e in s.extents
        }
    finally:
        kv.close()


def failover_files(c: StoreCluster) -> set[str]:
    """The extent files of table ``failover`` on the nodes' disks (committed or not)."""
    return {p.name for p in Path(c.root).glob("n*/tables/failover/*.arrow")}


def committed_ids(c: StoreCluster, table: str) -> set[str]:
    kv = EtcdKV(c.etcd)
    try:
        return {f"{e.id}.arrow" for e in Catalog(kv).table(table).extents()}
    finally:
        kv.close()


def test_standby_coordinator_takes_over_and_loses_nothing(cluster):
    """Two coordinators on one etcd: only the leader acts, the standby refuses naming it. SIGKILL
    the leader while an append is in flight: the standby (a new process, everything from etcd)
    leads once the leader's lease expires, and the client that follows the leader (``from_etcd``)
    sends the append of unknown fate again with its idempotency token: it commits once, every row
    exactly once. A resend of a committed token appends nothing. Then the new leader is killed
    just before an append (the CI failure: the call went out on the dead connection, ``Stream
    removed``): it is sent again to the next leader and commits once."""
    c, _ = cluster
    c.wait_leader()  # whatever an earlier test left: a live leader, else one started
    leader = c.leader()
    other = "coordinator-standby" if leader == "coordinator" else "coordinator"
    if other in c.procs and c.procs[other].poll() is None:
        c.kill(other)  # a leftover standby: start this test's own
    standby_address = c.start_standby(name=other)
    follower = StoreClient.from_etcd(c.kv)
    standby = StoreClient.from_address(standby_address)
    batch = pa.table({"k": pa.array(range(500), pa.int64()), "v": pa.array([2] * 500, pa.int64())})

    def keys(lo: int, hi: int) -> pa.Table:
        return pa.table(
            {"k": pa.array(range(lo, hi), pa.int64()), "v": pa.array([2] * (hi - lo), pa.int64())}
        )

    def exactly(hi: int) -> None:  # keys 0..hi-1, each once
        got = follower.sql("select count(k) as n, count(distinct k) as d, sum(k) as s from failover")
        assert got.to_pylist() == [{"n": hi, "d": hi, "s": sum(range(hi))}]

    try:
        assert c.coordinator_address != standby_address
        if "failover" in {t["name"] for t in follower.list_tables()}:
            follower.drop_table("failover")  # a rerun's leftover
        with pytest.raises(Unavailable, match="not the leader; the leader is "):
            standby.create_table("failover", batch.schema, ["k:hash:2", "v:hash:2", "k:hash:3"])
        with pytest.raises(Unavailable, match="not the leader"):
            standby.append("orders", ORDERS.slice(0, 10))
        follower.create_table("failover", batch.schema, ["k:hash:2", "v:hash:2", "k:hash:3"])
        first = follower.append("failover", batch, token="failover-first")
        before = failover_files(c)
        # kill the leader while an append is in flight: once the coordinator has written a
        # super-extent of it (3,000 rows each), long before it commits the 20th
        errors: list[BaseException] = []
        result: dict = {}

        def append() -> None:
            try:
                result.update(follower.append("failover", keys(500, 60_500)))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=append)
        t.start()
        deadline = time.monotonic() + 120
        while not (failover_files(c) - before) and t.is_alive():
            assert time.monotonic() < deadline, "the append wrote no extent in 120 s"
            time.sleep(0.01)
        c.kill(leader)  # no goodbye: its leader key goes with its lease (2 s)
        t.join(120)
        assert not t.is_alive() and not errors, errors
        assert result["rows"] == 60_000
        assert c.coordinator_address == standby_address
        # the first send was cut off before its commit: its extents are orphans (not committed)
        assert failover_files(c) - before - committed_ids(c, "failover")
        exactly(60_500)
        # a committed token sent again (its answer lost) appends nothing, on the new leader too
        assert follower.append("failover", batch, token="failover-first") == first
        exactly(60_500)
        assert follower.get_table("orders")["rows"] == N
        check_queries(follower, [QUERIES[0], QUERIES[1], QUERIES[3]])  # items grew in the kill test
        assert standby.get_table("failover")["rows"] == 60_500  # it leads now: it serves
        # the new leader dies just before the next append: sent again to the next leader, once
        c.start_standby(name=leader)
        c.kill(other)
        follower.append("failover", keys(60_500, 61_000))
        exactly(61_000)
        follower.drop_table("failover")
    finally:
        follower.close()
        standby.close()


ORDERS_QUERIES = [QUERIES[0], QUERIES[1], QUERIES[3]]


def test_sql_through_the_client_and_the_cli(fresh, capsys):
    from microco.cli import main

    c, client = fresh
    for _, sql in ORDERS_QUERIES:
        assert same(rows(client.sql(sql)), duck(sql)), (sql, client.last_plan)
    sql = (
        "select o_cust, count(distinct o_flag) as flags, sum(case when o_flag like 'A%' then o_price else 0 end) as a "
        "from orders where o_cust in (1, 2, 3) or o_price > 990 group by o_cust having count(*) > 1 order by o_cust"
    )
    assert same(rows(client.sql(sql)), duck(sql))
    assert client.last_plan["kind"] == "partition_local" and client.last_plan["replicas"] == {"orders": 1}
    assert "partition-local" in client.explain_sql(sql)
    join = (
        "select o_flag, sum(l_qty) as q from orders, items where o_id = l_oid group by o_flag order by o_flag"
    )
    frame = (
        client.table("orders")
        .join(client.table("items"), "o_id", "l_oid")
        .group_by("o_flag")
        .agg(q=("sum", "l_qty"))
    )
    assert same(rows(client.sql(join)), rows(frame.collect()))
    assert client.last_plan["kind"] == "join_copart"
    # a top-k of a table of many columns, materialized late on the nodes (real Flight reads of
    # the winners' rows): the same rows as DuckDB's
    r = np.random.default_rng(5)
    wide = pa.table({f"c{i}": r.integers(0, 1000, 4000) for i in range(8)} | {"id": np.arange(4000)})
    client.create_table("wide", wide.schema, ["id:hash:4", "c0:hash:4", "c1:hash:2"])
    client.append("wide", wide)
    top = "select * from wide where c3 < 500 order by c2 desc, id limit 7"
    assert "late materialization" in client.explain_sql(top)
    assert rows(client.sql(top)) == duck(top, {"wide": wide})
    client.drop_table("wide")
    client.sql(join)
    assert client.last_plan["kind"] == "partial_agg" and "co-partitioned" in client.last_plan["explain"]
    base = ["store", "--coordinator", c.coordinator_address]
    assert (
        main(
            [
                *base,
                "sql",
                "select o_flag, count(*) as n from orders group by o_flag order by o_flag",
                "--format",
                "json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [(r["o_flag"], r["n"]) for r in out] == duck("select o_flag, count(*) from orders group by o_flag")
    assert main([*base, "sql", "select o_id from orders where"]) == 1
    assert "syntax" in capsys.readouterr().err.lower()
    assert main([*base, "sql", "drop table orders"]) == 1
    assert client.get_table("orders")["rows"] == N


def test_bad_queries_over_the_wire_are_invalid_argument(fresh):
    _, client = fresh
    with pytest.raises(InvalidArgument, match="wehre"):
        client.query({"table": "orders", "wehre": [["o_cust", "=", 1]]})
    with pytest.raises(InvalidArgument, match="nested"):
        client.query('{"table": "orders", "where": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(InvalidArgument) as ei:
        client.get_table("x" * 20_000)
    assert len(str(ei.value)) < 500


def test_plain_flight_client_reads_a_table_in_parallel(fresh):
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.flight as flight

    from microco.clients.store import flight_client

    _, client = fresh
    node = client.nodes()[0]["address"]
    fc = flight_client(node)
    try:
        listed = {f.descriptor.path[0].decode(): f for f in fc.list_flights()}
        assert {"orders", "items"} <= set(listed) and listed["orders"].total_records == N
        info = fc.get_flight_info(flight.FlightDescriptor.for_path("orders"))
        # a plain client's get_schema (before: pyarrow's default, a NotImplementedError traceback)
        assert fc.get_schema(flight.FlightDescriptor.for_path("orders")).schema == info.schema
        cmd = flight.FlightDescriptor.for_command(json.dumps({"table": "items", "replica": 1}))
        assert fc.get_schema(cmd).schema.names == ITEMS.schema.names
        with pytest.raises(pa.ArrowException, match="no table .nope.") as refused:
            fc.get_schema(flight.FlightDescriptor.for_path("nope"))
        assert "_catalog.py" not in str(refused.value)  # no server traceback of where it arose
    finally:
        fc.close()
    assert info.schema.names == ORDERS.schema.names
    locations = {ep.locations[0].uri.decode() for ep in info.endpoints}
    assert len(info.endpoints) > 1 and len(locations) > 1  # extents of one replica on several nodes

    def read(ep):
        c = flight_client(ep.locations[0].uri.decode())
        try:
            return c.do_get(ep.ticket).read_all()
        finally:
            c.close()

    with ThreadPoolExecutor(8) as pool:
        parts = list(pool.map(read, info.endpoints))
    got = pa.concat_tables(parts).sort_by("o_id")
    assert got.num_rows == N and got.equals(ORDERS.cast(got.schema).sort_by("o_id"))
    for replica in (1, 2):
        fc = flight_client(node)
        try:
            cmd = flight.FlightDescriptor.for_command(json.dumps({"table": "items", "replica": replica}))
            eps = fc.get_flight_info(cmd).endpoints
        finally:
            fc.close()
        assert sum(read(ep).num_rows for ep in eps) == client.get_table("items")["rows"]


def test_scrub_finds_bit_rot_with_the_mtime_restored(fresh, capsys):
    from microco.cli import main

    c, client = fresh
    check_queries(client, ORDERS_QUERIES)  # every extent verified once by reads: the verification is cached
    kv = EtcdKV(c.etcd)
    try:
        e = Catalog(kv).table("orders").super_extents[0].replica(0)[0]
    finally:
        kv.close()
    path = Path(c.root) / e.node / "tables" / "orders" / f"{e.id}.arrow"
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2 - 384)
        f.write(os.urandom(768))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert main(["store", "--coordinator", c.coordinator_address, "scrub"]) == 0
    assert f"orders/{e.id}" in capsys.readouterr().out
    client.start_recovery()
    wait_recovered(client)
    assert client.scrub() == []
    invariant(c, "orders", "o_id", N)
    check_queries(client, ORDERS_QUERIES)


class Counted:
    """A ``StoreTable`` whose reads (extents fetched from the store) are counted."""

    reads = 0

    @staticmethod
    def wrap(src):
        from microco.clients.cache import StoreTable

        class _Counted(StoreTable):
            def read(self, path: str) -> bytes:
                Counted.reads += 1
                return super().read(path)

        return _Counted(src.node, src.table, replica=src.replica, columns=src.columns)


def read_twice_through_a_cache(index, src, dataset: str, key: str, expected: pa.Table, tmp_path) -> None:
    """Two jobs read ``src`` through a real cache server: each gets every row of ``expected``
    (sorted by ``key``) exactly once an epoch; the second is served wholly from the cache."""
    from microco.clients.cache import QuiverLoader, decode_sample
    from microco.services.cache import CacheCore, CacheServicer, ChunkStore, serve_in_process

    src = Counted.wrap(src)
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 2 * index.total_bytes, "coordinated")
    server, address = serve_in_process(CacheServicer(core))
    try:
        for job in ("first", "second"):
            Counted.reads = 0
            loader = QuiverLoader(
                index, src, batch_size=2, dataset=dataset, job_id=job, server=address, insert_misses=True
            )
            try:
                got = [decode_sample(d) for _, batch in loader.epoch(0) for d in batch]
            finally:
                loader.close()
            assert pa.concat_tables(got).sort_by(key).equals(expected)  # every row, once
            if job == "first":
                digests = [c.digest for c in index.chunks]
                deadline = time.monotonic() + 60
                while len(core.lookup(digests, dataset)) < len(digests):  # written behind
                    assert time.monotonic() < deadline, "the first job's reads never reached the cache"
                    time.sleep(0.05)
            else:
                assert loader.stats.hits == len(index.samples) and Counted.reads == 0
    finally:
        server.stop(0)


def test_a_table_is_a_training_dataset_read_through_the_cache(fresh, tmp_path):
    """Issue 21: a store table as a Quiver dataset. Each extent of the replica partitioned by
    the job's key is one content-addressed chunk, read over Flight from the node holding it;
    a job's loader gets every row once an epoch through a cache server, and the next job
    reads the table from the cache, not the store."""
    from microco.clients.cache import StoreTable, index_store_table

    _, client = fresh
    cols = ["o_id", "o_cust"]  # orders: 12 extents a replica (items has 80 after the kill test)
    live = [n["address"] for n in client.nodes() if n["alive"]]  # an earlier test kills a node
    src = StoreTable(live[0], "orders", replica=1, columns=cols)
    index = index_store_table(src)
    assert len(index.chunks) == len(index.samples) > 1  # one chunk per extent
    assert index_store_table(StoreTable(live[1], "orders", replica=1, columns=cols)) == index
    expected = client.read("orders", columns=cols).sort_by("o_id")
    read_twice_through_a_cache(index, src, "orders", "o_id", expected, tmp_path)


QUERY = "select o_id, o_cust, o_price, o_flag from orders where o_price > 100 and o_flag <> 'C'"


def test_a_query_result_is_a_training_dataset_read_through_the_cache(fresh, tmp_path):
    """Issue 21: a query's result as a Quiver dataset, written back to the store once as a
    table cut into samples of at most ``rows_per_sample`` rows; the same query on the same data
    gives the same table and the same digests (so two jobs share cache hits), and materialising
    it again elsewhere gives the same bytes; every row once an epoch through a cache server."""
    from microco.clients.cache import decode_sample, index_store_table, materialise_query, query_table

    _, client = fresh
    src = query_table(client, QUERY, rows_per_sample=100)
    assert src.table.startswith("q_") and src.replica == 0 and "_sample" not in (src.columns or [])
    index = index_store_table(src)
    want = duck(QUERY)
    assert len(index.samples) >= -(-len(want) // 100) > 1 and len(index.chunks) == len(index.samples)
    assert max(decode_sample(src.read(s.path)).num_rows for s in index.samples) <= 100
    # the same query on the same data: the same table, not a second copy; the same index
    assert query_table(client, QUERY, rows_per_sample=100).table == src.table
    assert index_store_table(query_table(client, QUERY, rows_per_sample=100)) == index
    # written again under another name (the order the query gives is not the order written)
    again = query_table(
        client, QUERY.replace("select o_id, o_cust", "select o_cust, o_id"), rows_per_sample=100
    )
    assert again.table != src.table
    copy = materialise_query(client, QUERY + " order by o_price desc", rows_per_sample=100, table="qcopy")
    assert copy == "qcopy" and client.get_table("qcopy")["rows"] == len(want)
    other = index_store_table(query_table(client, QUERY, rows_per_sample=100, table="qcopy"))
    assert sorted(s.digest for s in other.samples) == sorted(s.digest for s in index.samples)
    assert sorted(c.digest for c in other.chunks) == sorted(c.digest for c in index.chunks)
    # another sample size: another table
    assert query_table(client, QUERY, rows_per_sample=300).table != src.table
    whole = pa.concat_tables([decode_sample(src.read(s.path)) for s in index.samples])
    assert same(rows(whole), want)
    read_twice_through_a_cache(index, src, src.table, "o_id", whole.sort_by("o_id"), tmp_path)


def test_a_store_table_and_a_query_result_open_by_name(fresh, etcd_endpoint, tmp_path, monkeypatch):
    """``store://`` URLs in etcd's dataset records: ``open_loader`` opens a registered table
    (or a query's materialised table) as it opens a directory, nodes found through etcd."""
    from microco.clients.cache import decode_sample, open_loader, query_table, register_dataset
    from microco.services.cache import CacheCore, CacheServicer, ChunkStore, serve_in_process

    monkeypatch.setenv("MICROCO_HOME", str(tmp_path / "home"))
    _, client = fresh
    kv = EtcdKV(etcd_endpoint)
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 1 << 30, "coordinated")
    server, address = serve_in_process(CacheServicer(core))
    try:
        q = query_table(client, QUERY, rows_per_sample=250)
        cases = [
            (
                "orders-by-cust",
                "store://orders?replica=1&columns=o_id,o_cust",
                client.read("orders", columns=["o_id", "o_cust"]),
            ),
            ("big-orders", q.url, client.sql(QUERY)),
        ]
        for name, url, want in cases:
            rec, index = register_dataset(kv, name, url)
            assert rec.url == url and rec.num_chunks == len(index.samples) > 1
            assert register_dataset(kv, name, url)[0] == rec  # the same bytes again: a no-op
            loader = open_loader(kv, name, server=address, batch_size=4, job_id=f"job-{name}")
            try:
                got = pa.concat_tables([decode_sample(d) for _, b in loader.epoch(0) for d in b])
            finally:
                loader.close()
            assert same(rows(got), rows(want)), name
        with pytest.raises(NotFound, match="nosuch"):
            register_dataset(kv, "nosuch", "store://nosuch?replica=1")
        with pytest.raises(InvalidArgument, match="replica"):
            register_dataset(kv, "bad", "store://orders?replica=7")
        with pytest.raises(InvalidArgument, match="unknown"):
            register_dataset(kv, "bad", "store://orders?where=x")
    finally:
        server.stop(0)
        kv.close()


def test_bad_query_datasets_are_refused_clearly(fresh):
    from microco.clients.cache import StoreTable, materialise_query, query_table

    _, client = fresh
    with pytest.raises(InvalidArgument, match="only a SELECT"):
        materialise_query(client, "drop table orders")
    with pytest.raises(InvalidArgument, match="only a SELECT"):
        materialise_query(client, "")
    assert client.get_table("orders")["rows"] == N
    with pytest.raises((NotFound, InvalidArgument), match="nosuch"):
        query_table(client, "select * from nosuch")
    with pytest.raises(InvalidArgument, match="no rows"):
        query_table(client, "select o_id from orders where o_price < 0")
    with pytest.raises(InvalidArgument, match="rows_per_sample"):
        query_table(client, QUERY, rows_per_sample=0)
    live = [n["address"] for n in client.nodes() if n["alive"]]
    with pytest.raises(NotFound, match="nosuch"):
        StoreTable(live[0], "nosuch").list_files()
    assert not [t for t in client.list_tables() if "nosuch" in t["name"]]


def test_flight_sql_endpoint_is_registered_and_answers_adbc(fresh):
    """The coordinator process registers its Flight SQL address (label ``flight_sql``); the ADBC
    driver reaches it with the platform credentials and gets the SQL path's answer."""
    dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi")
    from microco.common import identity

    c, client = fresh
    uri = discover(c.kv, "store")[0].labels["flight_sql"]  # as c.coordinator_address is found
    me = identity.current()
    opts = {}
    if me is not None:
        assert uri.startswith("grpc+tls://")
        opts = {
            "adbc.flight.sql.client_option.tls_root_certs": me.ca_pem.decode(),
            "adbc.flight.sql.client_option.mtls_cert_chain": me.cert_pem.decode(),
            "adbc.flight.sql.client_option.mtls_private_key": me.key_pem.decode(),
            "adbc.flight.sql.client_option.tls_override_hostname": identity.SERVICE_NAME,
        }
    sql = "select o_flag, count(*) as n, sum(o_price) as s from orders group by o_flag order by o_flag"
    with dbapi.connect(uri, db_kwargs=opts, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        got = cur.fetch_arrow_table()
    assert same(rows(got), rows(client.sql(sql))) and same(rows(got), duck(sql))


def _file_codecs(cluster: StoreCluster, table: str) -> dict[int, set[str]]:
    """Each replica's codecs as its extent files on the nodes' disks say."""
    from microco.services.store._layout import open_extent

    kv = EtcdKV(cluster.etcd)
    try:
        info = Catalog(kv).table(table)
    finally:
        kv.close()
    out: dict[int, set[str]] = defaultdict(set)
    for e in info.extents():
        path = Path(cluster.root) / e.node / "tables" / table / f"{e.id}.arrow"
        out[e.replica].add(open_extent(path).codec)
    return dict(out)


def test_codecs_per_replica_and_a_live_recode_over_the_wire(fresh, capsys):
    from microco.api.store.v1 import store_pb2 as pb
    from microco.cli import main

    c, client = fresh
    base = ["store", "--coordinator", c.coordinator_address]
    schema_arg = "o_id:int64,o_cust:int64,o_price:float64"
    data = ORDERS.select(["o_id", "o_cust", "o_price"])
    create = [*base, "create", "coded", "--schema", schema_arg, "--replica", "o_id:hash:4"]
    assert main([*create, "--replica", "o_cust:hash:4@lz4", "--replica", "o_price:range:300,600"]) == 0
    assert "(hash, lz4)" in capsys.readouterr().out
    client.append("coded", data)
    assert _file_codecs(c, "coded") == {0: {"zstd"}, 1: {"lz4"}, 2: {"zstd"}}
    assert [r["codec"] for r in client.get_table("coded")["replicas"]] == ["zstd", "lz4", "zstd"]
    # a scan no replica's partitioning matches reads the lz4 replica, and EXPLAIN says why
    sql = "select count(*) as n, sum(o_price) as p from coded where o_price > 10"
    want = duck(sql.replace("coded", "orders"))
    assert same(rows(client.sql(sql)), want)
    assert client.last_plan["replicas"] == {"coded": 1}
    assert "decoding" in client.explain_sql(sql) and "lz4" in client.explain_sql(sql)
    read = [sum(n["read_by_replica"].get("coded", [0, 0, 0])[r] for n in client.nodes()) for r in range(3)]
    assert read[1] > 0 and read[0] == read[2] == 0  # the nodes say which replica served the reads
    # recode replica 2 to lz4 on the live table, followed to its end by the CLI
    assert main([*base, "recode", "coded", "2", "lz4", "--watch", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["state"] == "done" and rec["recoded"] == rec["extents"] > 0, rec
    assert _file_codecs(c, "coded") == {0: {"zstd"}, 1: {"lz4"}, 2: {"lz4"}}
    assert client.recode("coded", 2)["state"] == "done"
    assert same(rows(client.sql(sql)), want)
    assert same(
        rows(client.table("coded").on_replica(2).collect()), duck("select o_id, o_cust, o_price from orders")
    )
    # bad codecs: refused by the client, and by the coordinator when a request carries one
    with pytest.raises(InvalidArgument, match="unknown extent codec 'gzip'"):
        client.recode("coded", 1, "gzip")
    with pytest.raises(InvalidArgument, match="unknown extent codec 'gzip'"):
        client.create_table(
            "bad", data.schema, ["o_id", "o_cust", pb.Partitioning(column="o_price", codec="gzip")]
        )
    assert main([*create, "--replica", "o_cust", "--replica", "o_price", "--codecs", "zstd,lz4"]) == 1
    assert "three codecs" in capsys.readouterr().err
    client.drop_table("coded")


def test_a_paused_node_does_not_hold_a_query_to_its_calls_deadline(fresh):
    """A node that stops answering without closing its connections (SIGSTOP here; a host that
    lost power or its network alike) held a query in flight until its calls' 120 s deadline
    (measured: 121 s). The coordinator now sees the node leave the registry when its lease runs
    out (2 s here) and retries the query without it. Last in the module: it leaves a node dead."""
    c, client = fresh
    build, sql = QUERIES[0]  # group-by o_cust: agg_local on replica 1, partitioned on o_cust
    want = duck(sql)
    placement = client.get_table("orders", placement=True)["placement"]
    held = sorted({n for sx in placement.values() for n in sx.get("1", {}).values()})
    live = {r.instance_id for r in discover(c.kv, "store-node")}
    victim = next(n for n in held if n in live)
    box: dict = {}

    def run() -> None:
        try:
            box["rows"] = rows(build(client).on_replica(1).collect())
        except Exception as exc:  # noqa: BLE001 - reported below
            box["error"] = exc

    from microco.services.store._flight import FlightTransport
    from microco.services.store._placement import NodeInfo

    rec = next(r for r in discover(c.kv, "store-node") if r.instance_id == victim)
    node = NodeInfo(victim, "", rec.labels["flight"])
    asked = FlightTransport(c.kv)  # as the coordinator: the node's own record of its tasks
    before = asked.action(node, "stats", {})
    os.kill(c.procs[victim].pid, signal.SIGSTOP)
    thread = threading.Thread(target=run)
    try:
        thread.start()  # planned with the paused node while its lease lasts
        thread.join(90)
        assert not thread.is_alive(), "the query still waits on a paused node"
        # the losing attempt's task on the paused node is cancelled: the coordinator keeps
        # asking until the node runs again, which then has the cancel in its own record (the
        # task cancelled running, before it started, or found ended if it ran first)
        os.kill(c.procs[victim].pid, signal.SIGCONT)
        keys = ("cancelled_running", "cancelled_before_start", "cancel_not_running")
        end = time.monotonic() + 30
        while True:
            now = asked.action(node, "stats", {})
            if sum(now[k] for k in keys) > sum(before[k] for k in keys):
                break
            assert time.monotonic() < end, f"no cancel reached the node: {now}"
            time.sleep(0.1)
    finally:
        asked.close()
        c.kill(victim)  # (SIGKILL ends a stopped process too)
        thread.join()
    assert "error" not in box, box.get("error")
    assert same(box["rows"], want)


def test_cli_loads_the_files_analysts_have(fresh, tmp_path, capsys):
    """Held out (session 33): a Hive-partitioned folder of Parquet, a gzipped CSV and JSON lines
    were refused; a CSV whose column turns from integers to halves after its first block made
    `load` fail half-way with "Exception iterating requests!" and abort the process. Now each
    loads, the type change is inferred at `create --from` over the whole file, and a file that
    does not fit the table is refused naming the value, with nothing appended."""
    import gzip

    import pyarrow.csv as pcsv
    import pyarrow.dataset as pds

    from microco.cli import main

    c, client = fresh
    # Tests before this one kill nodes; three fault domains are needed. A node killed a moment
    # ago is still listed until its lease runs out: wait for each restarted one's new address.
    before = {n["name"]: n["address"] for n in client.nodes()}
    restarted = [name for name, _ in NODES if c.procs[name].poll() is not None]
    for name, domain in NODES:
        if name in restarted:
            c.start_node(name, domain)
    deadline = time.monotonic() + 60
    while True:
        now = {n["name"]: n["address"] for n in client.nodes() if n["alive"]}
        if all(name in now and now[name] != before.get(name) for name in restarted):
            break
        assert time.monotonic() < deadline, client.nodes()
        time.sleep(0.2)
    base = ["store", "--coordinator", c.coordinator_address]
    trips = pa.table(
        {"tid": np.arange(3000), "fare": np.arange(3000) * 0.25, "year": 2022 + np.arange(3000) % 2}
    )
    pds.write_dataset(
        trips, tmp_path / "trips", format="parquet", partitioning=["year"], partitioning_flavor="hive"
    )
    pcsv.write_csv(trips, tmp_path / "t.csv")
    with open(tmp_path / "t.csv", "rb") as f, gzip.open(tmp_path / "t.csv.gz", "wb") as g:
        g.write(f.read())
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trips.to_pylist()))
    reps = ["--replica", "tid", "--replica", "year:hash:2", "--replica", "fare:range:100,400"]
    assert main([*base, "create", "trips", "--from", str(tmp_path / "trips"), *reps]) == 0
    for source in (tmp_path / "trips", tmp_path / "t.csv.gz", tmp_path / "t.jsonl"):
        assert main([*base, "load", "trips", str(source)]) == 0, source
    capsys.readouterr()
    got = client.sql("select year, count(*) n, sum(fare) s from trips group by year order by year")
    assert got.to_pylist() == [
        {
            "year": y,
            "n": 3 * 1500,
            "s": 3 * float(trips.filter(pa.compute.equal(trips["year"], y))["fare"].to_numpy().sum()),
        }
        for y in (2022, 2023)
    ]
    with open(tmp_path / "drift.csv", "w") as f:
        f.write("id,amount\n")
        f.writelines(f"{i},{i if i < 30_000 else i + 0.5}\n" for i in range(40_000))
    reps = ["--replica", "id", "--replica", "amount", "--replica", "id:range:1000"]
    assert main([*base, "create", "drift", "--schema", "id:int64,amount:int64", *reps]) == 0
    assert main([*base, "load", "drift", str(tmp_path / "drift.csv")]) == 1
    err = capsys.readouterr().err
    assert "drift.csv" in err and "'30000.5'" in err and "nothing was appended" in err
    assert client.get_table("drift")["rows"] == 0
    assert main([*base, "create", "drift2", "--from", str(tmp_path / "drift.csv"), *reps]) == 0
    assert main([*base, "load", "drift2", str(tmp_path / "drift.csv")]) == 0
    assert client.sql("select count(*) n, sum(amount) s from drift2").to_pylist() == [
        {"n": 40_000, "s": sum(range(40_000)) + 0.5 * 10_000}
    ]

    # A stream that fails half-way (a reader's later block, a generator's error): the call is
    # cancelled, and the error says why, with nothing appended.
    def broken():
        yield pa.record_batch({"id": pa.array([1], pa.int64()), "amount": pa.array([2], pa.int64())})
        raise ValueError("the source went away")

    with pytest.raises(InvalidArgument, match="reading the rows to append failed.*the source went away"):
        client.append("drift", broken())
    assert client.get_table("drift")["rows"] == 0
