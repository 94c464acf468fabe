"""``store://`` dataset URLs (a store table as a backing store) and one chunk per file for a
store whose files' sizes are known only once read; no store needed (the node is given)."""

from __future__ import annotations

import pytest

from microco.clients.cache import StoreTable, index_store, open_store
from microco.common.errors import InvalidArgument

NODE = "grpc://127.0.0.1:1"


def test_a_store_table_url_round_trips():
    for t in (
        StoreTable(NODE, "items", replica=1, columns=["l_id", "l_qty"]),
        StoreTable(NODE, "items"),
        StoreTable(NODE, "q_abc", replica=0, columns=["a&b", "c"]),
    ):
        back = StoreTable.from_url(t.url, node=NODE)
        assert (back.table, back.replica, back.columns, back.url) == (t.table, t.replica, t.columns, t.url)
    assert (
        StoreTable(NODE, "items", replica=2, columns=["a", "b"]).url == "store://items?replica=2&columns=a,b"
    )


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("store://items?replica=x", "replica"),
        ("store://items?replica=5", "replica"),
        ("store://items?where=1", "unknown where"),
        ("store://", "bad store table URL"),
        ("store://items/extra", "bad store table URL"),
    ],
)
def test_bad_store_table_urls_are_refused(url, match):
    with pytest.raises(InvalidArgument, match=match):
        StoreTable.from_url(url, node=NODE)


def test_open_store_reads_a_store_url_as_a_table():
    with pytest.raises(InvalidArgument, match="unknown"):
        open_store("store://items?bogus=1")  # parsed before any store node is looked for


class _Files:
    """A backing store whose listing does not know its files' sizes (as a store table's)."""

    url = "mem://sizes-unknown"
    chunk_per_file = True

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def list_files(self) -> list[tuple[str, int]]:
        return [(p, 0) for p in sorted(self.files)]

    def read(self, path: str) -> bytes:
        return self.files[path]


def test_a_store_of_unknown_sizes_is_one_chunk_per_file():
    store = _Files({f"{k}": bytes([k]) * (10 + k) for k in range(5)})
    index = index_store(store, chunk_bytes=1 << 20)
    assert len(index.chunks) == len(index.samples) == 5
    assert [s.size for s in index.samples] == [10, 11, 12, 13, 14]
    store.chunk_per_file = False  # what the sizes listed (0) would otherwise make: one chunk
    assert len(index_store(store, chunk_bytes=1 << 20).chunks) == 1
