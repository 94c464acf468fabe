"""The committed generated code matches the protos, and every API version imports cleanly."""

import importlib
import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_generated_code_is_not_stale() -> None:
    generate = runpy.run_path(str(REPO / "protos" / "generate.py"))
    assert generate["check"]() == []


@pytest.mark.parametrize("svc", ["common", "agent", "scheduler", "cache", "store", "compiler"])
def test_generated_modules_import(svc: str) -> None:
    pb2 = importlib.import_module(f"microco.api.{svc}.v1.{svc}_pb2")
    importlib.import_module(f"microco.api.{svc}.v1.{svc}_pb2_grpc")
    assert pb2.DESCRIPTOR.package == f"microco.api.{svc}.v1"
