"""Every cache unit test keeps its dataset indexes in its own MICROCO_HOME."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cache_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MICROCO_HOME", str(tmp_path_factory.mktemp("microco-home")))
