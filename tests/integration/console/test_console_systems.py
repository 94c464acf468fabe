"""The compiler and store views against real compiler and store processes: what the console
shows is what those services answer over gRPC."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from console_harness import Platform, Proc, spawn, wait_registered

from microco.services.console import DEFAULT_DEV_TOKEN
from microco.services.console._gateway import SYSTEMS

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"}


@pytest.fixture(scope="module")
def systems(platform: Platform) -> Iterator[dict[str, list[Proc]]]:
    """A compiler and a store (coordinator and three nodes in three fault domains), started in parallel."""
    common = {"etcd": platform.etcd, "redis": platform.redis, "home": platform.home}
    procs: dict[str, list[Proc]] = {"compiler": [], "store": [], "store-node": []}
    if SYSTEMS["compiler"].in_build():
        procs["compiler"].append(
            spawn("microco.services.compiler", ["--metrics-port", "-1"], instance_id="compiler-c", **common)
        )
    if SYSTEMS["store"].in_build():
        procs["store"].append(
            spawn(
                "microco.services.store",
                ["coordinator", "--metrics-port", "-1"],
                instance_id="store-c",
                **common,
            )
        )
        for i in range(3):
            name = f"console-store-{i}"
            procs["store-node"].append(
                spawn(
                    "microco.services.store",
                    ["node", "--node", name, "--fault-domain", f"fd-{i}", "--metrics-port", "-1"],
                    instance_id=name,
                    **common,
                )
            )
    try:
        for service, ps in procs.items():
            for p in ps:
                wait_registered(platform.kv, service, p)
        yield procs
    finally:
        everything = [p for ps in procs.values() for p in ps]
        for p in everything:  # all at once: they shut down in parallel
            if p.proc.poll() is None:
                p.proc.terminate()
        for p in everything:
            p.stop()


@pytest.mark.skipif(not SYSTEMS["compiler"].in_build(), reason="the compiler is not part of this build")
def test_compiler_explorations_and_committed_configuration(platform: Platform, systems: dict) -> None:
    from microco.api.compiler.v1 import compiler_pb2 as pb
    from microco.api.compiler.v1 import compiler_pb2_grpc as pb_grpc
    from microco.common import dial

    # A client explores through the compiler's own API; the timings are what a step under each
    # configuration would report (the "fused" choice being the faster one).
    stub = pb_grpc.CompilerServiceStub(dial(systems["compiler"][0].record.address))
    config = stub.RegisterGraph(
        pb.RegisterGraphRequest(
            fingerprint="console-test-graph",
            input_shapes="32x64",
            hardware="cpu-test",
            model_name="console-lstm",
            framework="torch",
            total_steps=10000,
            variables=[
                pb.Variable(name="fusion", choices=["off", "fused"]),
                pb.Variable(name="threads", choices=["1", "2"]),
            ],
        ),
        timeout=10,
    )
    key = config.key
    for _ in range(40):
        if config.committed:
            break
        ms = (5.0 if config.values.get("fusion") == "fused" else 9.0) + (
            0.5 if config.values.get("threads") == "2" else 0.0
        )
        steps = max(config.steps, 2)
        config = stub.ReportTimings(
            pb.ReportTimingsRequest(key=key, trial=config.trial, step_ms=[ms * 3] + [ms] * (steps - 1)),
            timeout=10,
        )

    body = httpx.get(platform.url + "/api/v1/compiler", headers=ADMIN).json()
    assert body["available"] is True, body
    graph = next(g for g in body["graphs"] if g["key"] == key)
    measured = [t for t in graph["trials"] if t["step_ms"] > 0]
    assert len(measured) >= 2 and graph["model_name"] == "console-lstm"
    assert graph["best_step_ms"] == pytest.approx(min(t["step_ms"] for t in measured))
    assert graph["speedup"] >= 1.0
    one = httpx.get(f"{platform.url}/api/v1/compiler/graphs/{key}", headers=ADMIN).json()
    assert one["key"] == key and len(one["trials"]) == len(graph["trials"])
    if config.committed:
        assert graph["committed"] is True and graph["best"]["values"]["fusion"] == "fused"
    assert httpx.get(f"{platform.url}/api/v1/compiler/graphs/no-such-graph", headers=ADMIN).status_code == 404


@pytest.mark.skipif(not SYSTEMS["store"].in_build(), reason="the store is not part of this build")
def test_store_tables_replicas_nodes_and_recovery(platform: Platform, systems: dict) -> None:
    import pyarrow as pa

    from microco.clients.store import StoreClient

    client = StoreClient.from_etcd(platform.kv)
    deadline = time.monotonic() + 120
    while sum(n["alive"] for n in client.nodes()) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    schema = pa.schema([("k", pa.int64()), ("c", pa.int64()), ("d", pa.string())])
    client.create_table("console_t", schema, ["k:hash:4", "c:hash:4", "d:hash:4"])
    data = pa.table(
        {"k": list(range(100)), "c": [i % 7 for i in range(100)], "d": [f"x{i % 5}" for i in range(100)]}
    )
    client.append("console_t", data)

    body = httpx.get(platform.url + "/api/v1/store", headers=ADMIN).json()
    assert body["available"] is True, body
    table = next(t for t in body["tables"] if t["name"] == "console_t")
    assert table["rows"] == 100
    assert [(r["column"], r["kind"], r["partitions"]) for r in table["replicas"]] == [
        ("k", "hash", 4),
        ("c", "hash", 4),
        ("d", "hash", 4),
    ]
    nodes = {n["name"]: n for n in body["nodes"]}
    assert all(nodes[p.name]["alive"] for p in systems["store-node"])
    assert {nodes[p.name]["fault_domain"] for p in systems["store-node"]} == {"fd-0", "fd-1", "fd-2"}
    assert body["recovery"] is not None and body["recovery"]["unavailable_extents"] == 0
    deadline = time.monotonic() + 60  # the console samples recovery figures for its plot
    while not body["recovery_history"] and time.monotonic() < deadline:
        time.sleep(0.5)
        body = httpx.get(platform.url + "/api/v1/store", headers=ADMIN).json()
    assert body["recovery_history"] and body["recovery_history"][-1]["unavailable_extents"] == 0
    detail = httpx.get(platform.url + "/api/v1/store/tables/console_t", headers=ADMIN).json()
    assert detail["name"] == "console_t" and detail["placement"], detail
    assert httpx.get(platform.url + "/api/v1/store/tables/no_such_table", headers=ADMIN).status_code == 404

    # a query through the console answers what the SDK answers, on the replica partitioned by c
    query = {
        "table": "console_t",
        "group_by": ["c"],
        "aggs": [["count", "*", "n"]],
        "order_by": [["c", "asc"]],
    }
    r = httpx.post(platform.url + "/api/v1/store/query", headers=ADMIN, json={"query": query})
    assert r.status_code == 200, r.text
    result = r.json()
    expected = client.query(query).to_pylist()
    assert result["columns"] == ["c", "n"] and result["row_count"] == 7 and not result["truncated"]
    assert result["rows"] == [[row["c"], row["n"]] for row in expected]
    assert sum(n for _, n in result["rows"]) == 100 and result["plan_kind"]
    r = httpx.post(
        platform.url + "/api/v1/store/query", headers=ADMIN, json={"query": query, "explain_only": True}
    )
    assert r.status_code == 200 and r.json()["explain"] and r.json()["rows"] == []
    r = httpx.post(
        platform.url + "/api/v1/store/query", headers=ADMIN, json={"query": {"table": "no_such_table"}}
    )
    assert r.status_code in (400, 404), r.text
    # starting recovery is a change: the admin token only
    assert httpx.post(platform.url + "/api/v1/store/recovery").status_code == 401
    r = httpx.post(platform.url + "/api/v1/store/recovery", headers=ADMIN)
    assert r.status_code == 200 and r.json()["unavailable_extents"] == 0
    client.close()
