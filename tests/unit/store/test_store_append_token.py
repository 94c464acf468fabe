"""Appends carry an idempotency token (``StoreCore.append_batches(..., token)``): the commit
records it in the catalog (etcd) in the same transaction, so an append sent again with the same
token (its answer lost with a coordinator) is acknowledged with the first commit's result and
appends nothing, on whichever coordinator serves; of two sends racing (one on a deposed leader)
exactly one commits. The real processes across a SIGKILL fail-over:
``tests/integration/store/test_store_cluster.py``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from microco.api.store.v1 import store_pb2 as pb
from microco.clients.store import _client
from microco.common.errors import InvalidArgument
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore
from microco.services.store._catalog import APPENDS, Catalog
from microco.services.store._service import StoreServicer

SCHEMA = pa.schema([("k", pa.int64()), ("g", pa.int64())])
SPECS = [PartitionSpec("k", "hash", 3), PartitionSpec("g", "hash", 2), PartitionSpec("k", "hash", 2)]


def rows(lo: int, hi: int) -> pa.Table:
    k = np.arange(lo, hi, dtype=np.int64)
    return pa.table({"k": k, "g": k % 5}, schema=SCHEMA)


@pytest.fixture()
def stores(tmp_path):
    """Two coordinators' cores on one etcd and one set of nodes (a leader and the one that
    takes over, or a deposed leader still finishing an append)."""
    kv = MemoryKV()
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    a = StoreCore(kv, tr, super_extent_rows=1000, recovery_rate_bytes=0, gc_min_age_s=0)
    b = StoreCore(kv, tr, super_extent_rows=1000, recovery_rate_bytes=0, gc_min_age_s=0)
    a.create_table("t", SCHEMA, SPECS)
    return a, b, kv


def keys(core: StoreCore) -> list[int]:
    got, _ = core.query(Query("t", select=("k",)))
    return sorted(got.column("k").to_pylist())


def test_a_committed_token_sent_again_appends_nothing_on_any_coordinator(stores):
    a, b, _ = stores
    first = a.append_batches("t", rows(0, 2500).to_batches(), token="tok-1")
    assert first.rows == 2500 and len(first.super_extents) == 3
    read = []

    def again():
        read.append(1)
        yield from rows(0, 2500).to_batches()

    for core in (a, b):  # the same coordinator, or the one that took over
        res = core.append_batches("t", again(), token="tok-1")
        assert res == first
    assert read == []  # acknowledged from the record: the resend's rows are not even read
    assert keys(b) == list(range(2500)) and b.table("t").rows == 2500
    # another token (or none) is another append
    b.append_batches("t", rows(2500, 3000).to_batches(), token="tok-2")
    b.append_batches("t", rows(3000, 3100).to_batches())
    assert keys(a) == list(range(3100))


def test_two_sends_of_one_append_commit_once(stores):
    """The first send is still running on a deposed leader when the resend commits on the new
    one (or the other way round): the second commit finds the token and commits nothing; its
    extents are orphans, which garbage collection deletes."""
    a, b, _ = stores
    done = {}

    def slow():  # the deposed leader's send: the resend runs and commits while this one streams
        yield from rows(0, 1500).to_batches(max_chunksize=500)[:2]
        done["resend"] = b.append_batches("t", rows(0, 1500).to_batches(), token="tok")
        yield from rows(0, 1500).to_batches(max_chunksize=500)[2:]

    late = a.append_batches("t", slow(), token="tok")
    assert late == done["resend"] and late.rows == 1500
    assert keys(a) == list(range(1500))
    gc = a.collect_garbage(min_age_s=0)
    assert gc["deleted"] and not gc["errors"]  # the late send's extents
    assert keys(b) == list(range(1500))


def test_the_servicer_passes_the_token_and_the_client_sends_one(stores, monkeypatch):
    a, _, _ = stores
    sent = []
    monkeypatch.setattr(_client, "CHUNK", 4096)

    def requests(token: str):
        schema, stream = _client.record_batches(rows(0, 1200))
        for k, piece in enumerate(_client.ipc_chunks(schema, stream)):
            msg = pb.AppendRequest(table="t", arrow_ipc=piece, idempotency_token=token)
            if k:
                msg = pb.AppendRequest(arrow_ipc=piece)
            sent.append(msg)
            yield msg

    class Context:
        def invocation_metadata(self):
            return ()

    first = StoreServicer(a).Append(requests("x1"), Context())
    sent.clear()
    again = StoreServicer(a).Append(requests("x1"), Context())
    assert again == first and len(sent) == 1  # only the schema message is read
    assert a.table("t").rows == 1200


def test_tokens_are_checked_and_expire(stores):
    a, _, kv = stores
    for bad in ("", "x" * 129, "a/b", "tok en"):
        if bad:
            with pytest.raises(InvalidArgument, match="idempotency token"):
                a.append_batches("t", rows(0, 10).to_batches(), token=bad)
    assert a.table("t").rows == 0  # refused before anything was committed
    a.append_batches("t", rows(0, 10).to_batches(), token="old")
    cat = Catalog(kv)
    assert cat.committed_append("t", "old")["rows"] == 10
    assert cat.expire_append_tokens() == 0  # young: kept
    rec = kv.get_json(APPENDS + "t/old")
    assert cat.expire_append_tokens(ttl_s=60, now=rec["at"] + 61) == 1
    assert cat.committed_append("t", "old") is None
