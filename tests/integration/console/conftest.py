"""Fixtures: the console as its own process (``python -m microco.services.console``, the way
``microco up`` starts it) against the session's real etcd and Redis, with real services behind it.

One platform serves every test of this folder (booting four processes on two cores takes a while);
it is stopped as soon as the last test here is done, so that its scheduler never lingers beside
the processes of other folders' tests on the shared etcd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from console_harness import Platform, start_platform

pytestmark = pytest.mark.integration

_HERE = Path(__file__).parent
_RUNNING: dict[str, Platform] = {}


@pytest.fixture(scope="session")
def platform(
    etcd_endpoint: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    p = start_platform(etcd_endpoint, redis_url, tmp_path_factory.mktemp("console-platform"))
    _RUNNING["platform"] = p
    yield p
    p.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None or Path(str(nextitem.path)).parent != _HERE:
        p = _RUNNING.pop("platform", None)
        if p is not None:
            p.stop()
