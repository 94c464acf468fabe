"""The plots' arithmetic: device timelines and hit rates from samples."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from microco.services.console import hit_rate_series, job_timeline
from microco.services.console._timeline import state_seconds


def ev(at: float, state: str, node: str = "", devices: tuple = ()) -> dict:
    return {"at": at, "state": state, "node": node, "devices": list(devices)}


def test_periods_merge_repeated_samples_and_run_to_now() -> None:
    events = [ev(0, "queued"), ev(1, "running", "n1", ("n1/0",)), ev(2, "running", "n1", ("n1/0",))]
    periods = job_timeline(events, now=5)
    assert [(p["state"], p["start"], p["end"]) for p in periods] == [("queued", 0, 1), ("running", 1, 5)]


def test_suspend_resume_and_migration_are_marked() -> None:
    events = [
        ev(0, "queued"),
        ev(1, "running", "n1", ("n1/0",)),
        ev(3, "suspended"),
        ev(4, "running", "n1", ("n1/0",)),  # resumed where it was: not a migration
        ev(6, "migrating", "n1", ("n1/0",)),
        ev(7, "running", "n2", ("n2/1",)),  # resumed elsewhere: migrated
        ev(9, "packed", "n2", ("n2/1",)),
        ev(10, "finished", "n2", ()),
    ]
    periods = job_timeline(events, now=100)
    assert [p["state"] for p in periods] == [
        "queued",
        "running",
        "suspended",
        "running",
        "migrating",
        "running",
        "packed",
        "finished",
    ]
    assert [p["migrated"] for p in periods] == [False, False, False, False, False, True, False, False]
    # a terminal state ends the timeline at its own time, not at "now"
    assert periods[-1]["start"] == periods[-1]["end"] == 10
    secs = state_seconds(periods)
    assert secs["running"] == 2 + 2 + 2 and secs["suspended"] == 1 and secs["packed"] == 1


def test_out_of_order_samples_are_sorted() -> None:
    periods = job_timeline([ev(5, "running", "n", ("d",)), ev(1, "queued")], now=6)
    assert [p["state"] for p in periods] == ["queued", "running"]


def test_empty() -> None:
    assert job_timeline([], now=1) == []
    assert hit_rate_series([]) == []


def test_hit_rate_from_counters_with_restart() -> None:
    samples = [
        {"at": 0, "hits": 0, "misses": 0},
        {"at": 1, "hits": 3, "misses": 1},
        {"at": 2, "hits": 3, "misses": 1},  # idle: left out
        {"at": 3, "hits": 1, "misses": 0},  # server restarted: new baseline, no negative rate
        {"at": 4, "hits": 2, "misses": 1},
    ]
    assert hit_rate_series(samples) == [
        {"at": 1.0, "hit_rate": 0.75, "lookups": 4.0},
        {"at": 4.0, "hit_rate": 0.5, "lookups": 2.0},
    ]


states = st.sampled_from(["queued", "running", "suspended", "packed", "migrating", "finished"])


@settings(max_examples=60, database=None)
@given(
    st.lists(st.tuples(st.floats(0, 1000, allow_nan=False), states, st.sampled_from(["a", "b"])), max_size=30)
)
def test_periods_are_ordered_and_non_negative(samples: list) -> None:
    periods = job_timeline([ev(t, s, n, (n + "/0",)) for t, s, n in samples], now=2000)
    for p in periods:
        assert p["end"] >= p["start"]
    for a, b in itertools.pairwise(periods):
        assert a["end"] <= b["start"] + 1e-9


def test_state_history_without_placement_merges_with_observed_placements() -> None:
    # the scheduler's own history says only the state; the console's samples carry the devices
    history = [
        ev(0, "queued"),
        ev(1.0, "running"),
        ev(5.0, "suspended"),
        ev(6.0, "running"),
        ev(9.0, "finished"),
    ]
    observed = [ev(1.2, "running", "n1", ("n1/0",)), ev(6.1, "running", "n2", ("n2/0",))]
    periods = job_timeline(history + observed, now=100)
    assert [(p["state"], p["start"], p["end"], p["devices"], p["migrated"]) for p in periods] == [
        ("queued", 0, 1.0, [], False),
        ("running", 1.0, 5.0, ["n1/0"], False),
        ("suspended", 5.0, 6.0, [], False),
        ("running", 6.0, 9.0, ["n2/0"], True),
        ("finished", 9.0, 9.0, [], False),
    ]


def test_nothing_after_a_terminal_state() -> None:
    periods = job_timeline(
        [ev(0, "running", "n", ("d",)), ev(1, "cancelled"), ev(2, "running", "n", ("d",))], now=9
    )
    assert [p["state"] for p in periods] == ["running", "cancelled"]


def test_console_samples_taken_across_a_transition_do_not_invent_states() -> None:
    from microco.services.console._series import SeriesStore
    from microco.services.console._views import _job_events_name, _with_timeline

    series = SeriesStore(None)
    # the scheduler's history: a restart after a crash at 0.44
    history = [
        ev(0, "queued"),
        ev(0.18, "running"),
        ev(0.44, "queued"),
        ev(0.44, "running"),
        ev(5.27, "finished"),
    ]
    for e in (ev(0.2, "running", "n", ("n/0",)), ev(0.45, "queued", "n"), ev(0.45, "running", "n", ("n/0",))):
        series.append(_job_events_name("j"), e)
    job = {
        "id": "j",
        "state": "finished",
        "node": "n",
        "device_ids": [],
        "finished_at": 5.27,
        "submitted_at": 0,
    }
    out = _with_timeline(series, job, now=10, history=history)
    assert [(p["state"], p["start"], p["end"], p["devices"]) for p in out["timeline"]] == [
        ("queued", 0, 0.18, []),
        ("running", 0.18, 0.44, ["n/0"]),
        ("queued", 0.44, 0.44, []),
        ("running", 0.44, 5.27, ["n/0"]),
        ("finished", 5.27, 5.27, []),
    ]


def test_without_the_schedulers_history_the_timeline_still_starts_at_submission() -> None:
    """The scheduler's record could not be read (best effort) and the console first sampled the
    job already running: the job still waited in the queue from its submission until then."""
    from microco.services.console._series import SeriesStore
    from microco.services.console._views import _job_events_name, _with_timeline

    series = SeriesStore(None)
    series.append(_job_events_name("j"), ev(0.5, "running", "n", ("n/0",)))
    job = {
        "id": "j",
        "state": "finished",
        "node": "n",
        "device_ids": [],
        "finished_at": 3.0,
        "submitted_at": 0.2,
    }
    out = _with_timeline(series, job, now=10, history=[])
    assert [(p["state"], p["start"], p["end"]) for p in out["timeline"]] == [
        ("queued", 0.2, 0.5),
        ("running", 0.5, 3.0),
        ("finished", 3.0, 3.0),
    ]
    # Nothing sampled at all: queued from submission to the current state.
    out = _with_timeline(SeriesStore(None), {**job, "id": "k"}, now=10, history=[])
    assert [p["state"] for p in out["timeline"]] == ["queued", "finished"]


def test_per_job_cache_counters_are_found_wherever_the_server_reports_them() -> None:
    from microco.services.console._views import per_job_counters

    stats = {
        "hits": 10,
        "jobs": ["a", "b"],  # names only: no counters
        "datasets": [{"dataset": "d", "bytes": 1, "chunks": 1}],
        "job_stats": [{"job_id": "a", "hits": 7, "misses": 3}, {"job": "b", "hits": 0, "misses": 2}],
    }
    assert per_job_counters(stats) == {"a": {"hits": 7, "misses": 3}, "b": {"hits": 0, "misses": 2}}
    assert per_job_counters({"hits": 1, "jobs": ["a"]}) == {}


def test_recorder_samples_progress_only_while_a_job_can_progress() -> None:
    from microco.services.console._series import SeriesStore
    from microco.services.console._views import _job_events_name, _job_progress_name, record_job

    series, seen = SeriesStore(None), {}
    job = {"id": "j", "state": "running", "node": "n", "device_ids": ["n/0"], "step": 5, "minibatch_ms": 10.0}
    assert record_job(series, job, 1.0, seen) is True
    assert record_job(series, {**job, "step": 9}, 2.0, seen) is False  # same state: no new event
    done = {**job, "state": "finished", "device_ids": [], "step": 12}
    assert record_job(series, done, 3.0, seen) is True
    record_job(series, done, 4.0, seen)
    record_job(series, done, 5.0, seen)
    assert [e["state"] for e in series.read(_job_events_name("j"))] == ["running", "finished"]
    assert [p["step"] for p in series.read(_job_progress_name("j"))] == [5, 9, 12]
