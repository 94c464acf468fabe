"""The console's registration is revoked on SIGTERM even when the signal lands while it is being
written: its key already in etcd, the object not yet kept (CI saw the key left to expire).
Threads and events only: no clock."""

from __future__ import annotations

import threading

from microco.services.console._server import Presence


class _SlowRegistration:
    """Writes its key, then waits to be let go before ``start`` returns."""

    def __init__(self, written: threading.Event, release: threading.Event) -> None:
        self.written, self.release = written, release
        self.live = False

    def start(self) -> _SlowRegistration:
        self.live = True  # the key is in etcd from here on
        self.written.set()
        assert self.release.wait(30)
        return self

    def stop(self) -> None:
        self.live = False


def test_leaving_while_the_registration_is_written_revokes_it() -> None:
    written, release = threading.Event(), threading.Event()
    reg = _SlowRegistration(written, release)
    presence = Presence(lambda: reg)
    entering = threading.Thread(target=presence.enter)
    entering.start()
    assert written.wait(30)
    leaving = threading.Thread(target=presence.leave)  # the SIGTERM handler
    leaving.start()
    release.set()
    entering.join(30)
    leaving.join(30)
    assert not reg.live and presence.registration is None


def test_leaving_first_is_final() -> None:
    made: list[_SlowRegistration] = []
    done = threading.Event()
    done.set()

    def make() -> _SlowRegistration:
        made.append(_SlowRegistration(threading.Event(), done))
        return made[-1]

    presence = Presence(make)
    presence.leave()
    presence.enter()  # the registering thread, late: nothing is written
    assert made == [] and presence.registration is None
    presence2 = Presence(make)
    presence2.enter()
    presence2.enter()  # once
    assert len(made) == 1 and made[0].live
    presence2.leave()
    presence2.leave()  # idempotent
    assert not made[0].live
