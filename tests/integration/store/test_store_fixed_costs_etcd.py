"""A query's plan reads the catalog's version and the live store nodes in one request to a real
etcd (``KV.get_many``: one transaction of range reads; issue 19, session 32). A second or two."""

from __future__ import annotations

from typing import Any

import pytest

from microco.common.kv import EtcdKV
from microco.common.registry import Registration, ServiceRecord
from microco.services.store import StoreCore
from microco.services.store._catalog import VERSION
from microco.services.store._flight import NODE_SERVICE, FlightTransport
from microco.services.store._partition import PartitionSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _counting(kv: EtcdKV, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The requests ``kv`` sends to etcd from now on (each goes through ``_call``)."""
    sent: list[str] = []
    call = kv._call

    def counted(fn: Any, *a: Any, **k: Any) -> Any:
        sent.append(getattr(fn, "__name__", "call"))
        return call(fn, *a, **k)

    monkeypatch.setattr(kv, "_call", counted)
    return sent


def test_get_many_reads_keys_and_prefixes_in_one_request(
    namespaced_kv: EtcdKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = namespaced_kv
    kv.put("/a/2", b"y")
    kv.put("/a/1", b"x")
    kv.put("/ab", b"not under /a/")
    kv.put("/b", b"z")
    sent = _counting(kv, monkeypatch)
    got = kv.get_many(["/b", "/nope"], ["/a/", "/c/"])
    assert got == ([b"z", None], [[("/a/1", b"x"), ("/a/2", b"y")], []])
    assert got == ([kv.get("/b"), kv.get("/nope")], [kv.get_prefix("/a/"), kv.get_prefix("/c/")])
    assert sent[0] == "transaction" and len(sent) == 1 + 4  # (then the four separate reads)


def test_a_plan_reads_version_and_registry_in_one_etcd_request(
    namespaced_kv: EtcdKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    kv = namespaced_kv
    regs = [
        Registration(
            kv,
            ServiceRecord(
                NODE_SERVICE,
                f"n{i}",
                f"127.0.0.1:{4100 + i}",
                labels={"fault_domain": f"rack{i}", "flight": f"grpc://127.0.0.1:{4100 + i}"},
            ),
        ).start()
        for i in range(3)
    ]
    try:
        transport = FlightTransport(kv)
        core = StoreCore(kv, transport)
        core.create_table(
            "t", pa.schema([("k", pa.int64()), ("v", pa.int64())]), [PartitionSpec("k", "hash", 2)] * 3
        )
        token, live = core.version_and_live_nodes()
        assert token is not None and token == kv.get(VERSION)
        assert [n.name for n in live] == ["n0", "n1", "n2"] == [n.name for n in transport.live_nodes()]
        assert {n.name: (n.domain, n.address) for n in live} == {
            n.name: (n.domain, n.address) for n in transport.live_nodes()
        }
        sent = _counting(kv, monkeypatch)
        core.version_and_live_nodes()
        assert sent == ["transaction"]
    finally:
        for r in regs:
            r.stop()
        transport.close()
