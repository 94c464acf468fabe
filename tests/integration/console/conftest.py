"""Fixtures: the console as its own process (``python -m microco.services.console``, the way
``microco up`` starts it) against the session's real etcd and Redis, with real services behind it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from console_harness import Platform, start_platform

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def platform(etcd_endpoint: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    p = start_platform(etcd_endpoint, redis_url, tmp_path_factory.mktemp("console-platform"))
    yield p
    p.stop()
