"""A read grant covers its ticket as the coordinator signed it; a client may narrow the ticket to
some of its partitions (``units``, unsigned: the Spark connector's one Spark partition per store
partition) but not change what it reads. (The connector used to rewrite the ticket's sources,
which the node refused: "the read grant does not match its ticket".)"""

from __future__ import annotations

import json

import pytest

from microco.clients.store import check_grant, grant_ticket, narrow_to_units
from microco.common.errors import InvalidArgument, PermissionDenied
from tests._support import issued

SOURCES = [{"node": "n0", "table": "t", "extent": f"e{p}", "unit": [1, p], "bytes": 10} for p in range(3)] + [
    {"node": "n0", "table": "t", "extent": "e9", "unit": [1, 0], "bytes": 10}
]
TASK = {"op": "fragment", "table": "t", "left": {"sources": SOURCES, "read": ["k"], "keep": ["k"]}}


def test_a_granted_fragment_narrowed_to_a_partition_reads_only_that_partition():
    store = issued("service:store")
    ticket = json.loads(grant_ticket(store, TASK, "user:alice"))
    ca = store.ca_pem
    narrowed = {**ticket, "units": [[1, 0]]}
    check_grant(ca, narrowed, "user:alice")  # the signature still covers it
    got = narrow_to_units(dict(narrowed))
    assert [s["extent"] for s in got["left"]["sources"]] == ["e0", "e9"] and "units" not in got
    assert narrow_to_units({**ticket, "units": []})["left"]["sources"] == []
    assert narrow_to_units(dict(ticket)) == ticket  # no units: as granted
    # what the connector did before: the sources rewritten, no longer what was signed
    rewritten = {**ticket, "left": {**ticket["left"], "sources": SOURCES[:1]}}
    with pytest.raises(PermissionDenied, match="does not match its ticket"):
        check_grant(ca, rewritten, "user:alice")
    for bad in ([[1]], "0", [[1, "0"]], [[1, True]]):
        with pytest.raises(InvalidArgument, match="units"):
            narrow_to_units({**ticket, "units": bad})
    with pytest.raises(InvalidArgument, match="units"):
        narrow_to_units({"op": "read", "units": [[1, 0]]})
