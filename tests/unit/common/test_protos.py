"""The committed generated code matches the protos, and every API version imports cleanly."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_generated_code_is_not_stale() -> None:
    # protoc runs in a process of its own: in-process it shares protobuf's native state with
    # whatever the suite imported before (TensorFlow, torch) and can crash the run.
    proc = subprocess.run(
        [sys.executable, str(REPO / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("svc", ["common", "agent", "scheduler", "cache", "store", "compiler"])
def test_generated_modules_import(svc: str) -> None:
    pb2 = importlib.import_module(f"microco.api.{svc}.v1.{svc}_pb2")
    importlib.import_module(f"microco.api.{svc}.v1.{svc}_pb2_grpc")
    assert pb2.DESCRIPTOR.package == f"microco.api.{svc}.v1"
