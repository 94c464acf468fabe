"""The suite's own dealing (tests/conftest.py): under ``--dist loadfile`` the files of a
``ONE_WORKER`` unit go to one worker together; every other file is its own unit."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def conftest(pytestconfig: pytest.Config) -> object:
    """tests/conftest.py as pytest loaded it (``import conftest`` may find another folder's)."""
    path = REPO / "tests" / "conftest.py"
    for plugin in pytestconfig.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and Path(plugin.__file__).resolve() == path:
            return plugin
    pytest.fail(f"{path} is not loaded")


def test_every_file_of_a_unit_exists(conftest) -> None:
    for paths in conftest.ONE_WORKER.values():
        for path in paths:
            assert (REPO / path).is_file(), f"{path} is in ONE_WORKER but not in the tree"


def test_the_units_files_share_one_scope_and_others_keep_their_own(
    conftest, pytestconfig: pytest.Config
) -> None:
    pytest.importorskip("xdist")

    class Config:
        """This run's configuration, dealing by file."""

        def __init__(self, dist: str) -> None:
            self.dist = dist

        def getvalue(self, name: str) -> object:
            return {"dist": self.dist, "tx": ["popen"]}.get(name) or pytestconfig.getvalue(name)

        def __getattr__(self, name: str) -> object:
            return getattr(pytestconfig, name)

    sched = conftest.pytest_xdist_make_scheduler(Config("loadfile"), None)  # type: ignore[arg-type]
    if sched is None:
        pytest.fail("no scheduler for --dist loadfile")
    unit = conftest.ONE_WORKER["tensorflow-in-process"]
    scopes = {sched._split_scope(f"{path}::test_x") for path in unit}  # type: ignore[attr-defined]
    assert scopes == {"tensorflow-in-process"}
    other = "tests/unit/common/test_protos.py"
    assert sched._split_scope(f"{other}::test_y") == other  # type: ignore[attr-defined]
    assert conftest.pytest_xdist_make_scheduler(Config("load"), None) is None  # type: ignore[arg-type]


def test_no_two_test_modules_share_a_basename() -> None:
    """Test folders are not packages, so pytest imports each test file by its basename: a second
    file of one name stops the whole suite's collection ("import file mismatch"; a merge brought
    tests/unit/store/ and tests/integration/store/test_store_fixed_costs.py together, 2026-12-04)."""
    seen: dict[str, Path] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if "__pycache__" in path.parts or (path.parent / "__init__.py").exists():
            continue
        other = seen.setdefault(path.name, path)
        assert other == path, f"{other.relative_to(REPO)} and {path.relative_to(REPO)} share a basename"
