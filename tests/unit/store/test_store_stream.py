"""Streaming loads: a generator of record batches is appended without the client or the
coordinator holding the whole table. The coordinator reads the Arrow IPC stream as the messages
arrive and writes each super-extent while the rest is still coming; the rows become visible only
at the commit, and a stream that fails half-way commits nothing (its extents are orphans)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from microco.api.store.v1 import store_pb2 as pb
from microco.clients.store import _client
from microco.common.errors import InvalidArgument
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore
from microco.services.store._service import StoreServicer

BATCH, BATCHES = 1000, 12
SCHEMA = pa.schema([("k", pa.int64()), ("g", pa.int64()), ("s", pa.string())])
SPECS = [PartitionSpec("k", "hash", 3), PartitionSpec("g", "hash", 2), PartitionSpec("s", "hash", 2)]


def _batch(i: int) -> pa.RecordBatch:
    k = np.arange(i * BATCH, (i + 1) * BATCH, dtype=np.int64)
    return pa.record_batch([k, k % 7, pa.array([f"row {x}" for x in k])], schema=SCHEMA)


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(_client, "CHUNK", 8192)  # many messages per batch, as a big load has
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    core = StoreCore(MemoryKV(), tr, super_extent_rows=3000, recovery_rate_bytes=0, gc_min_age_s=0)
    core.create_table("t", SCHEMA, SPECS)
    return core, tr


def _files(tr) -> int:
    return sum(1 for s in tr.stores.values() for _ in (s.data_dir / "tables").glob("t/*.arrow"))


def _requests(batches):
    schema, stream = _client.record_batches(batches)
    for k, piece in enumerate(_client.ipc_chunks(schema, stream)):
        yield pb.AppendRequest(table="t" if k == 0 else "", arrow_ipc=piece)


class _Context:
    def invocation_metadata(self):
        return ()


def test_a_generator_is_appended_super_extent_by_super_extent(store):
    core, tr = store
    seen = []

    def gen():
        for i in range(BATCHES):
            # by the 8th batch, super-extents of the first are on the nodes, yet nothing is visible
            seen.append((_files(tr), core.table("t").rows))
            yield _batch(i)

    res = StoreServicer(core).Append(_requests(gen()), _Context())
    assert res.rows == BATCH * BATCHES and len(res.super_extents) == BATCH * BATCHES // 3000
    assert seen[0] == (0, 0) and seen[7][0] > 0 and all(rows == 0 for _, rows in seen)
    got, _ = core.query(Query("t", select=("k",)))
    assert sorted(got.column("k").to_pylist()) == list(range(BATCH * BATCHES))


def test_a_stream_that_fails_half_way_commits_nothing(store):
    core, tr = store

    def broken():
        for i in range(BATCHES):
            if i == 7:
                raise ConnectionError("the client went away")
            yield _batch(i)

    with pytest.raises((ConnectionError, InvalidArgument), match="the client went away"):
        StoreServicer(core).Append(_requests(broken()), _Context())
    assert core.table("t").rows == 0 and _files(tr) > 0  # written, never committed
    assert core.collect_garbage()["deleted"] and _files(tr) == 0

    def bad_schema():
        yield _batch(0)
        yield _batch(1)
        yield pa.record_batch([pa.array(["x"]), pa.array([1]), pa.array(["y"])], names=["k", "g", "s"])

    with pytest.raises((InvalidArgument, pa.ArrowInvalid)):
        StoreServicer(core).Append(_requests(bad_schema()), _Context())
    assert core.table("t").rows == 0


def test_what_append_takes_becomes_a_lazy_stream():
    pulled = []

    def gen():
        for i in range(3):
            pulled.append(i)
            yield _batch(i)

    schema, stream = _client.record_batches(gen())
    assert schema == SCHEMA and pulled == [0]  # only the first batch, for the schema
    assert sum(b.num_rows for b in stream) == 3 * BATCH
    reader = pa.RecordBatchReader.from_batches(SCHEMA, iter([_batch(0)]))
    assert _client.record_batches(reader)[0] == SCHEMA
    with pytest.raises(InvalidArgument, match="empty"):
        _client.record_batches(iter([]))
    with pytest.raises(InvalidArgument, match="not tables"):
        _client.record_batches([pa.table({"k": [1]})])
