"""Issue 21 on a table the project did not write: store tables as training data checked on
another shape than the store tests' TPC-H-like tables. Binary images, float32 features, a list
column, timestamps, booleans, nulls, a string label; three replicas partitioned by a shard key,
by the label (range, one label per partition) and by a hash of a float; several super-extents,
so every label is several shards. Real store processes (three nodes, three fault domains, a
coordinator) on the session's etcd, a real cache server (gRPC on a free port)."""

from __future__ import annotations

import time

import blake3
import numpy as np
import pyarrow as pa
import pytest

from microco.clients.store import StoreClient
from microco.common.errors import InvalidArgument
from microco.common.kv import EtcdKV
from microco.services.store._procs import StoreCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LABELS = ["cat", "dog", "eel", "fox"]
N = 2400


def _pets() -> pa.Table:
    rng = np.random.default_rng(21)
    labels = rng.choice(LABELS, N)
    feats = rng.random((N, 3), dtype=np.float32)
    ok = rng.random(N) < 0.5
    ok_arr = pa.array(ok, mask=rng.random(N) < 0.1)  # some nulls
    return pa.table(
        {
            "img": pa.array([rng.bytes(int(rng.integers(16, 64))) for _ in range(N)], pa.binary()),
            "feat": pa.array(feats[:, 0], pa.float32()),
            "emb": pa.array([list(map(float, f)) for f in feats], pa.list_(pa.float32())),
            "taken": pa.array(1_700_000_000_000 + rng.integers(0, 10**9, N), pa.timestamp("ms")),
            "ok": ok_arr,
            "shard": pa.array(np.arange(N) % 7, pa.int16()),
            "label": pa.array(labels, pa.string()),
        }
    )


@pytest.fixture(scope="module")
def pets(etcd_endpoint, tmp_path_factory):
    kv = EtcdKV(etcd_endpoint)
    for prefix in ("/microco/store/", "/microco/services/store"):  # another module's store's
        kv.delete_prefix(prefix)
    kv.close()
    # three nodes in three fault domains; super-extents of 600 rows, so four of them
    racks = [(f"p{i}", f"rack{i}") for i in range(3)]
    root = tmp_path_factory.mktemp("pets-store")
    c = StoreCluster(etcd_endpoint, root, racks, coordinator_args=["--super-extent-rows", "600"]).start()
    client = StoreClient.from_address(c.coordinator_address)
    table = _pets()
    client.create_table("pets", table.schema, ["shard:hash:3", "label:range:dog,eel,fox", "feat:hash:2"])
    client.append("pets", table)
    yield client, table
    client.close()
    c.stop()


def _rows(t: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


def test_a_table_of_another_shape_is_a_dataset_partitioned_by_its_label(pets, tmp_path):
    from microco.clients.cache import (
        QuiverLoader,
        StoreTable,
        decode_sample,
        index_store_table,
        replica_partitioned_by,
    )
    from microco.services.cache import CacheCore, CacheServicer, ChunkStore, serve_in_process

    client, table = pets
    # the replica whose partitioning suits a job that reads by label, found by its column
    assert replica_partitioned_by(client, "pets", "label") == 1
    assert replica_partitioned_by(client, "pets", "shard") == 0
    with pytest.raises(InvalidArgument, match="partitioned by 'img'"):
        replica_partitioned_by(client, "pets", "img")
    live = [n["address"] for n in client.nodes() if n["alive"]]
    src = StoreTable(live[0], "pets", replica=1)
    index = index_store_table(src)
    # each extent one sample and one chunk, named by the BLAKE3 digest of its bytes
    assert len(index.chunks) == len(index.samples)
    by_label = dict.fromkeys(LABELS, 0)
    for s in index.samples:
        data = src.read(s.path)
        assert blake3.blake3(data).hexdigest() == s.digest and len(data) == s.size
        labels = set(decode_sample(data).column("label").to_pylist())
        assert len(labels) == 1, (s.path, labels)  # label-partitioned: one label a sample
        by_label[labels.pop()] += 1
    assert all(n >= 2 for n in by_label.values()), by_label  # several shards of every label
    # the same table planned from another node: the same samples, the same digests
    assert index_store_table(StoreTable(live[1], "pets", replica=1)) == index

    # two jobs through a real cache server: every row, with its types, once an epoch; the
    # second job served wholly from the cache, the store not read
    reads = {"n": 0}

    class Counted(StoreTable):
        def read(self, path: str) -> bytes:
            reads["n"] += 1
            return super().read(path)

    counted = Counted(live[0], "pets", replica=1)
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 4 * index.total_bytes, "coordinated")
    server, address = serve_in_process(CacheServicer(core))
    try:
        for job in ("first", "second"):
            reads["n"] = 0
            loader = QuiverLoader(
                index, counted, batch_size=2, dataset="pets", job_id=job, server=address, insert_misses=True
            )
            try:
                got = pa.concat_tables([decode_sample(d) for _, batch in loader.epoch(0) for d in batch])
            finally:
                loader.close()
            assert got.schema.equals(table.schema)
            assert _rows(got) == _rows(table)
            if job == "first":
                digests = [c.digest for c in index.chunks]
                deadline = time.monotonic() + 60
                while len(core.lookup(digests, "pets")) < len(digests):  # written behind
                    assert time.monotonic() < deadline, "the first job's reads never reached the cache"
                    time.sleep(0.05)
            else:
                assert loader.stats.hits == len(index.samples) and reads["n"] == 0
    finally:
        server.stop(0)


def test_a_table_opens_by_name_on_the_replica_of_its_label(pets, etcd_endpoint, tmp_path, monkeypatch):
    from microco.clients.cache import StoreTable, decode_sample, open_loader, register_dataset

    monkeypatch.setenv("MICROCO_HOME", str(tmp_path / "home"))
    client, table = pets
    kv = EtcdKV(etcd_endpoint)
    try:
        src = StoreTable.from_url("store://pets?partitioned_by=label&columns=label,feat", kv)
        assert src.replica == 1 and src.url == "store://pets?replica=1&columns=label,feat"
        rec, index = register_dataset(
            kv, "pets-by-label", "store://pets?partitioned_by=label&columns=label,feat"
        )
        assert rec.url == src.url  # the record names the replica chosen
        loader = open_loader(kv, "pets-by-label", server=False, batch_size=4, job_id="job-pets")
        try:
            got = pa.concat_tables([decode_sample(d) for _, b in loader.epoch(0) for d in b])
        finally:
            loader.close()
        assert _rows(got) == _rows(table.select(["label", "feat"]))
        with pytest.raises(InvalidArgument, match="not both"):
            StoreTable.from_url("store://pets?partitioned_by=label&replica=0", kv)
        with pytest.raises(InvalidArgument, match="partitioned by 'nope'"):
            StoreTable.from_url("store://pets?partitioned_by=nope", kv)
    finally:
        kv.close()
