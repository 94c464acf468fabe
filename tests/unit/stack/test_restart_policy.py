"""The supervisor's restart policy: exponential back-off, capped, and a give-up after too many
failures within the window (old failures age out)."""

from __future__ import annotations

from microco.services.stack._restart import RestartPolicy, RestartTracker


def test_back_off_doubles_and_is_capped() -> None:
    t = RestartTracker(RestartPolicy(base_s=0.5, cap_s=3.0, window_s=100.0, max_failures=10))
    delays = [t.failed(float(i)) for i in range(6)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_gives_up_after_max_rapid_failures() -> None:
    t = RestartTracker(RestartPolicy(base_s=0.5, cap_s=30.0, window_s=60.0, max_failures=3))
    assert t.failed(0.0) is not None
    assert t.failed(1.0) is not None
    assert t.failed(2.0) is None
    assert "3 failures within 60s" in t.describe_give_up()


def test_failures_outside_the_window_are_forgotten() -> None:
    t = RestartTracker(RestartPolicy(base_s=1.0, cap_s=30.0, window_s=10.0, max_failures=3))
    assert t.failed(0.0) == 1.0
    assert t.failed(5.0) == 2.0
    # 20 s later the earlier failures have aged out: back to the base delay, no give-up.
    assert t.failed(25.0) == 1.0
    assert t.failed(26.0) == 2.0
