"""ORDER BY .. LIMIT k is a select-k per fragment (no full sort), with the same answer as a full sort."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from microco.services.store import _exec

RNG = np.random.default_rng(11)
N = 20_000
T = pa.table(
    {
        "id": np.arange(N),
        "price": pa.array(np.round(RNG.random(N) * 100, 1), mask=RNG.random(N) < 0.05),  # ties and nulls
        "cat": RNG.choice(["a", "b", "c"], N),
    }
)


@pytest.mark.parametrize(
    "order",
    [
        [("price", True)],
        [("price", False)],
        [("cat", False), ("price", True)],
        [("price", True), ("id", False)],
    ],
)
@pytest.mark.parametrize("k", [0, 1, 10, 1000, N, N + 5])
def test_select_k_equals_full_sort(order, k):
    got = _exec.order_limit(T, order, k)
    full = T.sort_by([(c, "descending" if d else "ascending") for c, d in order]).slice(0, k)
    keys = [c for c, _ in order]
    assert got.num_rows == full.num_rows
    assert got.select(keys).to_pylist() == full.select(keys).to_pylist()
    if "id" in keys:  # unique keys: the very same rows
        assert got.equals(full)


def test_top_k_selects_k_before_sorting(monkeypatch):
    calls = []
    real = pc.select_k_unstable

    def spy(table, k, sort_keys, **kw):
        calls.append((table.num_rows, k))
        return real(table, k=k, sort_keys=sort_keys, **kw)

    monkeypatch.setattr(_exec.pc, "select_k_unstable", spy)
    got = _exec.order_limit(T, [("price", True)], 10)
    assert calls == [(N, 10)] and got.num_rows == 10
