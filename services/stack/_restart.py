"""When the local supervisor restarts a crashed service: exponential back-off, capped, and a
give-up after too many failures in a short window (a service that cannot start must not be
restarted forever, hiding the cause in a log nobody reads)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RestartPolicy:
    """``base_s`` before the first restart, doubling per failure within ``window_s`` up to
    ``cap_s``; after ``max_failures`` failures within ``window_s`` the service is given up on."""

    base_s: float = 0.5
    cap_s: float = 30.0
    window_s: float = 60.0
    max_failures: int = 5


@dataclass
class RestartTracker:
    """The failure history of one supervised process (times are ``time.monotonic()``)."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    failures: deque[float] = field(default_factory=deque)
    restarts: int = 0

    def failed(self, now: float) -> float | None:
        """Record an exit at ``now``; the delay before restarting it, or None to give up."""
        self.failures.append(now)
        while self.failures and now - self.failures[0] > self.policy.window_s:
            self.failures.popleft()
        recent = len(self.failures)
        if recent >= self.policy.max_failures:
            return None
        return min(self.policy.base_s * 2 ** (recent - 1), self.policy.cap_s)

    def describe_give_up(self) -> str:
        return f"{len(self.failures)} failures within {self.policy.window_s:.0f}s"
