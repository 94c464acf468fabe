"""Fixtures: the console as its own process (``python -m microco.services.console``, the way
``microco up`` starts it) against the session's real etcd and Redis, with real services behind it.

One platform serves every test of this folder (booting four processes on two cores takes a while);
it is stopped as soon as the last test here is done, so that its scheduler never lingers beside
the processes of other folders' tests on the shared etcd."""

from __future__ import annotations

from pathlib import Path

import pytest
from console_harness import Platform, start_platform

pytestmark = pytest.mark.integration

_HERE = Path(__file__).parent
_RUNNING: dict[str, Platform] = {}


@pytest.fixture(scope="module")
def platform(etcd_endpoint: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Platform:
    """The folder's platform: started by the first test module of this folder that a worker runs,
    reused by the next ones while the worker stays in the folder, started again when a worker
    (pytest-xdist hands out whole files) comes back to the folder after the platform was stopped."""
    p = _RUNNING.get("platform")
    if p is None:
        p = start_platform(etcd_endpoint, redis_url, tmp_path_factory.mktemp("console-platform"))
        _RUNNING["platform"] = p
    return p


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None or Path(str(nextitem.path)).parent != _HERE:
        p = _RUNNING.pop("platform", None)
        if p is not None:
            p.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    p = _RUNNING.pop("platform", None)
    if p is not None:
        p.stop()
