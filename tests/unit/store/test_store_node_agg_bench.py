"""The node-aggregation harness (``benchmarks/store_node_agg.py``, issue 19, session 37): its run
count of a sorted layout, and its alternative Acero source answering as the nodes' own."""

from __future__ import annotations

import datetime

import pyarrow as pa

from microco.benchmarks.store_node_agg import acero_agg, slices, sorted_runs, whole
from microco.services.store import _exec


def test_sorted_runs_counts_runs_within_each_batch() -> None:
    day = datetime.date(1995, 1, 1)
    a = pa.record_batch({"k": pa.array([day, day, day + datetime.timedelta(1), day], pa.date32())})
    b = pa.record_batch({"k": pa.array([day + datetime.timedelta(1)] * 3, pa.date32())})
    empty = pa.record_batch({"k": pa.array([], pa.date32())})
    # batch a sorted: day x3, day+1 -> 2 runs; b: 1 run (runs never cross a batch)
    assert sorted_runs(pa.Table.from_batches([a, empty, b]), "k") == 3


def test_both_feeds_answer_as_the_nodes_aggregation() -> None:
    t = pa.table({"k": [i % 7 for i in range(5000)], "v": [float(i) for i in range(5000)]})
    tables = [pa.Table.from_batches(t.slice(o, 5000 // 4).to_batches()) for o in range(0, 5000, 5000 // 4)]
    tables = [
        pa.Table.from_batches([b for x in (x.slice(0, 300), x.slice(300)) for b in x.to_batches()])
        for x in tables
    ]
    aggs = [["sum", "v", "s"], ["count", "*", "n"]]
    want = _exec.stream_post(_exec.peeked(iter(tables)), {"agg": {"keys": ["k"], "aggs": aggs}}).sort_by("k")
    assert [len(whole(x)) for x in tables] == [1] * 4
    assert [len(slices(x)) for x in tables] == [1] * 4  # two small batches made one by ``compact``'s rule
    for feed in (whole, slices):
        got = acero_agg(tables, feed, "k", aggs).sort_by("k")
        assert got.column("k").equals(want.column("k"))
        assert got.column("s").equals(want.column("s"))
        assert got.column("n").cast(pa.int64()).equals(want.column("n"))


def test_runs_prototype_sums_and_counts_per_group() -> None:
    from decimal import Decimal

    from microco.benchmarks.store_node_agg import _sort_subbuckets, runs_prototype

    keys = [3, 1, 3, 2, 1, 3, 2, 2]
    vals = [Decimal(f"{i}.25") for i in range(8)]
    t = pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(vals, pa.decimal128(15, 2))})
    ext = pa.Table.from_batches(t.slice(0, 5).to_batches() + t.slice(5).to_batches())
    got = runs_prototype([_sort_subbuckets(ext, "k")], "k", ["v"]).sort_by("k").to_pylist()
    # the decimals' low words: the unscaled integers (x100)
    want = {k: (sum(int(v * 100) for kk, v in zip(keys, vals) if kk == k), keys.count(k)) for k in set(keys)}
    assert [(r["k"], r["v_sum"], r["n_sum"]) for r in got] == [(k, *want[k]) for k in sorted(want)]
