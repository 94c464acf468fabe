"""Bad input to the store (issue 16): request names never become paths outside the data root,
unknown query fields are refused by name, deep nesting and oversized values are clear
INVALID_ARGUMENT errors (not RecursionError), and error text never echoes unbounded input."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from microco.common.errors import FailedPrecondition, InvalidArgument, NotFound
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, NodeStore, PartitionSpec, Query, StoreCore
from microco.services.store._core import node_action
from microco.services.store._limits import safe_path


@pytest.fixture()
def node(tmp_path):
    return NodeStore("n0", tmp_path / "n0")


@pytest.mark.parametrize("name", ["{victim}", "../../victim", "..", ".", "a/../../victim", "", "x" * 300])
def test_drop_table_never_leaves_the_data_directory(tmp_path, node, name):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    with pytest.raises(InvalidArgument):
        node_action(node, "drop_table", {"table": name.format(victim=victim)})
    assert (victim / "precious").read_text() == "keep me"


def test_extent_paths_are_checked_for_every_action(tmp_path, node):
    outside = tmp_path / "outside.arrow"
    outside.write_text("x")
    for action, body in [
        ("delete", {"table": "t", "extent": "../../outside"}),
        ("delete", {"table": "..", "extent": "outside"}),
        ("verify", {"table": "t", "extent": str(tmp_path / "outside"), "checksum": "x"}),
    ]:
        with pytest.raises(InvalidArgument):
            node_action(node, action, body)
    assert outside.exists()
    with pytest.raises(InvalidArgument):
        node.read("t", "../../outside")


def test_a_symlink_out_of_the_data_root_is_refused(tmp_path, node):
    (tmp_path / "elsewhere").mkdir()
    (node.data_dir / "tables").mkdir(parents=True)
    (node.data_dir / "tables" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidArgument, match="leaves the data directory"):
        node_action(node, "drop_table", {"table": "link"})
    assert (tmp_path / "elsewhere").exists()
    assert safe_path(node.data_dir, "tables", "ok_name-1") == node.data_dir.resolve() / "tables" / "ok_name-1"


@pytest.mark.parametrize("key", ["wehre", "grup_by"])
def test_unknown_query_fields_are_refused_by_name(key):
    with pytest.raises(InvalidArgument, match=key):
        Query.from_json(json.dumps({"table": "t", key: [["a", "=", 1]]}))


def test_unknown_join_fields_are_refused():
    with pytest.raises(InvalidArgument, match="lefton"):
        Query.from_json(
            {"table": "t", "join": {"table": "u", "lefton": "a", "left_on": "a", "right_on": "b"}}
        )


def test_deeply_nested_query_is_invalid_argument_not_recursion_error():
    deep = '{"table": "t", "where": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(InvalidArgument, match="nested"):
        Query.from_json(deep)
    # nesting inside a filter value is refused too, and a mildly nested one is not a crash
    with pytest.raises(InvalidArgument):
        Query.from_json({"table": "t", "where": [["a", "in", [[1, [2]]]]]})


@pytest.mark.parametrize(
    "q",
    [
        {"table": "t" * 1_000_000},
        {"table": "t", "select": ["c" * 1_000_000]},
        {"table": "t", "where": [["c" * 1_000_000, "=", 1]]},
        {"table": "t", "where": [["a", "x" * 1_000_000, 1]]},
        {"table": "t", "limit": "x" * 1_000_000},
        {"table": "t", "aggs": [["sum", "a"]]},
        {"table": "t", "limit": -1},
        {"table": "t", "replica": 7},
        {"table": "t", "where": "a = 1"},
    ],
)
def test_bad_values_are_short_invalid_argument(q):
    with pytest.raises(InvalidArgument) as ei:
        Query.from_json(json.dumps(q))
    assert len(str(ei.value)) < 400


def test_oversized_query_text_is_refused():
    with pytest.raises(InvalidArgument, match="limit"):
        Query.from_json('{"table": "t", "select": [' + ",".join(['"a"'] * 400_000) + "]}")


def test_store_errors_do_not_echo_huge_ids(tmp_path):
    core = StoreCore(MemoryKV(), LocalTransport(str(tmp_path), [NodeInfo("n0", "d0")]))
    core.create_table("t", pa.schema([("a", pa.int64())]), [PartitionSpec("a", "hash", 2)] * 3)
    huge = "x" * 1_000_000
    for call in (
        lambda: core.table(huge),
        lambda: core.drop_table(huge),
        lambda: core.query(Query("t", select=(huge[:256],))),
        lambda: core.create_table(huge, pa.schema([("a", pa.int64())]), [PartitionSpec("a", "hash", 2)] * 3),
    ):
        with pytest.raises((InvalidArgument, NotFound)) as ei:
            call()
        assert len(str(ei.value)) < 400
    with pytest.raises(FailedPrecondition) as ei:
        node_action(core.transport.stores["n0"], "x" * 1_000_000, {})
    assert len(str(ei.value)) < 400


def test_json_depth_counted_before_parsing_agrees_with_the_character_loop():
    # the nesting check every ticket passes (a semi-join's keys make tickets megabytes long)
    # counts in C: the same depth as the character-by-character reference, strings (escaped
    # quotes, brackets inside, unterminated) included
    import random

    from microco.services.store._limits import _text_depth, _text_depth_slow, load_json

    rng = random.Random(19)
    for _ in range(1000):
        text = "".join(rng.choice('[]{}"\\ax\n') for _ in range(rng.randint(0, 30)))
        for limit in (0, 2, 16):
            assert min(_text_depth(text, limit), limit + 1) == min(
                _text_depth_slow(text, limit), limit + 1
            ), text
    assert _text_depth('{"a": "[[[[\\"[[", "b": [[1]]}', 16) == 3
    assert load_json(json.dumps({"keys": "x" * 100_000, "s": [[1], {"t": "]]]}"}]}), "t", max_depth=3)
    with pytest.raises(InvalidArgument, match="nested more than 2"):
        load_json('{"a": [{"b": 1}], "s": "{{"}', "t", max_depth=2)
