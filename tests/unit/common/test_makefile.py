"""`make demo` says what it is doing while it installs (not minutes of silence) and passes
extra arguments through (`make demo ARGS="--console-port 18083"`). Checked with `make -n`,
which prints the commands without running them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry(*args: str, venv: Path) -> str:
    out = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={venv}", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("target", ["demo", "up"])
def test_extra_arguments_reach_microco_up(target: str, tmp_path: Path) -> None:
    out = _dry(target, "ARGS=--console-port 18083 --devices 2", venv=tmp_path / "venv")
    line = next(x for x in out.splitlines() if "microco up" in x)
    assert line.rstrip().endswith("--console-port 18083 --devices 2"), line


def test_install_says_what_it_does(tmp_path: Path) -> None:
    out = _dry("demo", venv=tmp_path / "venv")
    pip = next(x for x in out.splitlines() if "pip install" in x and "-e" in x)
    assert " -q " not in pip  # pip's own progress (what it collects, downloads, installs) is shown
    echoes = [x for x in out.splitlines() if x.startswith("echo")]
    assert any("installing" in x for x in echoes) and any("first time" in x for x in echoes), out
