"""The demo's closing summary: each mechanism read from what the systems recorded (job
histories, the cache's index, the store's plans, the compiler's graphs), with the reason when a
run did not show it; one screen."""

from __future__ import annotations

from microco.examples._demo_summary import (
    MECHANISMS,
    cache_row,
    compiler_row,
    recovery_row,
    scheduler_rows,
    store_row,
    summary_lines,
)


def _job(name: str, *history: tuple[str, str]) -> dict:
    return {"name": name, "history": [[float(i), s, m] for i, (s, m) in enumerate(history)]}


BUSY = [
    _job(
        "digits-lstm-0",
        ("queued", "submitted"),
        ("running", "start on n1/0 (attempt 1)"),
        ("suspended", "suspended at step 12 (parked on n1): gandiva: time-slice, quantum over, x waits"),
        ("running", "resumed in place on n1/0 (resume)"),
        ("migrating", "migrating to n2/1: operator: migrate"),
        ("running", "migrated on n2/1 (attempt 2)"),
        ("running", "migrated in place onto n2/0 (same node, re-pinned): operator: migrate"),
        ("finished", "finished at step 87"),
    ),
    _job(
        "digits-lstm-1",
        ("packed", "pack on n1/0 (attempt 1)"),
        ("running", "resized from 1 to 2 devices: gandiva: grow onto idle devices"),
        ("running", "resized from 2 to 1 devices: gandiva: undo grow to 2 devices (1.02x the throughput)"),
    ),
]


def test_every_mechanism_seen_with_its_evidence() -> None:
    rows = [
        *scheduler_rows(BUSY, devices=2),
        cache_row(True, "abcdef0123456789", [0.5, 0.97]),
        store_row(
            {
                "group-by rider_id": {"kind": "agg_local", "moved_bytes": 0, "replicas": {"trips": 1}},
                "group-by day": {"kind": "agg_shuffle", "moved_bytes": 123456, "replicas": {"trips": 0}},
            },
            ["trip_id", "rider_id", "city"],
        ),
        recovery_row(
            {
                "done": True,
                "node": "store-node-2",
                "rebuilt": 24,
                "lost": 24,
                "state": "done",
                "same_answer": True,
            }
        ),
        compiler_row(
            [
                {
                    "name": "demo-digits-lstm",
                    "trials": 6,
                    "committed": True,
                    "best": {"a.compile": "eager", "threads": 2},
                }
            ]
        ),
    ]
    assert [r["mechanism"] for r in rows] == list(MECHANISMS)
    assert all(r["seen"] for r in rows), rows
    by = {r["mechanism"]: r["evidence"] for r in rows}
    assert by["time-slicing"].startswith("1 suspend(s)") and "digits-lstm-0" in by["time-slicing"]
    assert by["migration"].startswith("2 move(s)")  # one through a restart, one in place
    assert "resized from 1 to 2 devices" in by["grow-shrink"] and "resized from 2 to 1" in by["grow-shrink"]
    assert "abcdef012345" in by["cache shared"] and "97%" in by["cache shared"]
    assert by["store routing"] == (
        "group-by rider_id: agg_local on replica 1 (rider_id); "
        "group-by day: agg_shuffle on replica 0 (trip_id), 123,456 bytes shuffled"
    )
    assert by["store recovery"] == "killed store-node-2: 24/24 extents rebuilt (done); same answer after: yes"
    assert by["compiler commit"] == "demo-digits-lstm committed after 6 trials: threads=2, a.compile=eager"
    lines = summary_lines(rows)
    assert len(lines) == 1 + len(MECHANISMS) and all(len(line) <= 120 for line in lines)


def test_what_a_run_did_not_show_says_why() -> None:
    quiet = [_job("a", ("running", "start"), ("finished", "done")), _job("b", ("finished", "done"))]
    rows = {r["mechanism"]: r for r in scheduler_rows(quiet, devices=2)}
    assert not any(r["seen"] for r in rows.values())
    assert rows["time-slicing"]["evidence"] == "never more jobs than devices (2 jobs on 2 devices)"
    assert rows["packing"]["evidence"] == "every job had a device of its own"
    crowded = {r["mechanism"]: r for r in scheduler_rows(quiet, devices=1)}
    assert crowded["time-slicing"]["evidence"] == "no quantum ended while a job waited"
    one = {r["mechanism"]: r for r in scheduler_rows(quiet[:1], devices=1)}
    assert one["time-slicing"]["evidence"] == "never more jobs than devices (1 job on 1 device)"
    assert not cache_row(False, "x" * 16, [0.9])["seen"]  # hits, but not on a shared index
    assert not cache_row(True, "x" * 16, [None, 0.0])["seen"]
    # a shuffle that moved nothing (one node) was still not routed to a matching replica
    assert not store_row({"q": {"kind": "agg_shuffle", "moved_bytes": 0, "replicas": {"t": 0}}})["seen"]
    assert recovery_row({"done": False, "why": "3 store nodes, fewer than 6"}) == {
        "mechanism": "store recovery",
        "seen": False,
        "evidence": "3 store nodes, fewer than 6",
    }
    row = compiler_row([{"name": "m", "trials": 3, "committed": False, "best": {}}])
    assert not row["seen"] and "still exploring after 3 trials" in row["evidence"]
