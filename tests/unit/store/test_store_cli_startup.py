"""Simple CLI commands start without loading gRPC, pyarrow or torch: `microco --help` and parsing
`microco store tables` import only the command line (the issue measured ~4.7 s per command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROTOS = str(Path(__file__).resolve().parents[3] / "protos")

PROBE = """
import sys
import microco.cli
parser = microco.cli.build_parser()
parser.parse_args(["store", "tables"])
for argv in (["--help"], ["store", "--help"], ["store", "tables", "--help"]):
    try:
        parser.parse_args(argv)
    except SystemExit:
        pass
heavy = ("grpc", "pyarrow", "torch", "tensorflow", "numpy", "microco.common", "microco.services")
print("LOADED", *sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy)))
"""


def test_help_and_argument_parsing_load_no_grpc_pyarrow_or_torch():
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PROTOS},
        timeout=120,
        check=True,
    ).stdout
    loaded = out.strip().splitlines()[-1].split()[1:]
    assert out.strip().splitlines()[-1].startswith("LOADED") and not loaded, f"loaded at start-up: {loaded}"


def test_the_policy_flag_lists_and_checks_the_registered_policies(capsys):
    from microco.cli import build_parser
    from microco.services.scheduler.policy import available_policies

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--help"])
    assert ", ".join(available_policies()) in " ".join(capsys.readouterr().out.split())
    assert parser.parse_args(["sim", "--policy", "gandiva"]).policy == "gandiva"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["sim", "--policy", "no-such-policy"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'no-such-policy'" in err and "gandiva" in err
