"""microco.clients.compiler: Astra's client side.

Wrap a PyTorch model (:class:`AstraTorch`) or a TensorFlow training step (:class:`AstraTF`) so
that each mini-batch runs under a configuration chosen at run time by the compiler service
(:class:`RemoteExplorer`) or the same exploration core in-process (``LocalExplorer``).
:func:`attach_fit` runs a Keras model's own ``model.fit`` through the same exploration.
``torch.compile(model, backend=MicrocoBackend(explorer))`` (or ``backend="microco"`` after
:func:`register_backend`) is the dynamo-backend form. The frameworks are imported lazily:
importing this package needs neither.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._session import ExplorationSession, Explorer, baseline

__all__ = [
    "AstraFit",
    "AstraKerasFit",
    "AstraTF",
    "AstraTorch",
    "ExplorationSession",
    "Explorer",
    "MicrocoBackend",
    "RemoteExplorer",
    "StepsProfiler",
    "attach_fit",
    "baseline",
    "register_backend",
]

_LAZY = {
    "AstraTorch": "._torch",
    "AstraTF": "._tf",
    "AstraFit": "._keras_fit",
    "AstraKerasFit": "._keras_fit",
    "attach_fit": "._keras_fit",
    "RemoteExplorer": "._remote",
    "StepsProfiler": "._tf_profile",
    "MicrocoBackend": "._backend",
    "register_backend": "._backend",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)
