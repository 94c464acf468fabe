"""A long-tail model zoo: recurrent cells written from primitive operators, in PyTorch and
TensorFlow, with synthetic data. The frameworks are imported lazily: ``zoo.torch_models`` and
``zoo.tf_models`` are loaded on first use."""

from __future__ import annotations

import importlib
from typing import Any

CELL_NAMES = ("lstm", "milstm", "gru", "lnlstm", "sru")

__all__ = ["CELL_NAMES", "tf_models", "torch_models"]


def __getattr__(name: str) -> Any:
    if name == "torch_models":
        return importlib.import_module("._torch_models", __name__)
    if name == "tf_models":
        return importlib.import_module("._tf_models", __name__)
    raise AttributeError(name)
