"""The layering rule, read from the code: arrows only go down.

    api (generated)  <-  common  <-  clients  <-  services  <-  cli, console, stack, benchmarks, examples

A module may import its own layer and the layers below it, never a layer above; a service never
imports another service (they talk over gRPC and etcd; what both ends share lives in
``clients/``); and nothing reaches into another package's private (``_underscore``) modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _source import REPO, ROOTS, imports, modules, shown

# Longest prefix wins. The console and the local stack are servers, but they sit on top: the
# console reads every system, the stack launches every service.
LAYERS = {
    "microco.api": 0,
    "microco.common": 1,
    "microco.clients": 2,
    "microco.services": 3,
    "microco.services.console": 4,
    "microco.services.stack": 4,
    "microco.cli": 4,
    "microco.benchmarks": 4,
    "microco.examples": 4,
}
LAYER_NAMES = ["api", "common", "clients", "services", "top (cli, console, stack, benchmarks, examples)"]


def _layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def _owner(module: str) -> str:
    """The package a module belongs to, for the private-module rule: ``microco.<layer>.<system>``
    (``microco.common`` and ``microco.cli`` are one package each)."""
    parts = module.split(".")
    return ".".join(
        parts[:2] if parts[1] in ("common", "cli", "api", "benchmarks", "examples") else parts[:3]
    )


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    found = []
    for line, target, names in imports(module, path):
        found.append((line, target))
        # ``from microco.x import _private`` names a private module too.
        found += [(line, f"{target}.{n}") for n in names if n.startswith("_")]
    return found


def _violations() -> list[str]:
    bad = []
    for module, path in modules():
        here = _layer(module)
        for line, target in _imports(module, path):
            where = f"{shown(path)}:{line} imports {target}"
            there = _layer(target)
            if there > here:
                bad.append(f"{where}: {LAYER_NAMES[here]} may not import {LAYER_NAMES[there]}")
                continue
            if (
                here == there == 3
                and _owner(module) != _owner(target)
                and not target.startswith("microco.services.runtime")
            ):
                bad.append(f"{where}: a service imports another service (share it through clients/)")
            private = [p for p in target.split(".")[2:] if p.startswith("_") and not p.startswith("__")]
            if private and _owner(module) != _owner(target):
                bad.append(f"{where}: reaches into another package's private module")
    return bad


def test_every_module_imports_only_its_own_layer_and_the_layers_below():
    assert _violations() == []


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a client importing a service is found."""
    pkg = tmp_path / "clients"
    pkg.mkdir()
    (pkg / "bad.py").write_text("from microco.services.cache import CacheCore\n")
    monkeypatch.setitem(ROOTS, "microco.clients", pkg)
    assert any("clients may not import services" in v for v in _violations())


def test_a_training_process_loads_no_server_code():
    """A job that imports the scheduler hook, the cache loader and the compiler wrapper (and the
    store client) pulls in nothing from ``microco.services`` and no server runtime, nor gRPC's
    health-checking package (session 30: ``microco.common`` imported its health probe, and a GPU
    machine whose image lacked that package could not import the compiler's client)."""
    code = (
        "import sys\n"
        "import microco.clients.scheduler as s, microco.clients.cache as c\n"
        "import microco.clients.compiler as k, microco.clients.store as t\n"
        "from microco.clients.cache import _loader\n"
        "s.TorchHook, s.SchedulerCallback, s.SchedulerClient, c.open_loader, k.__name__\n"
        "bad = sorted(m for m in sys.modules if m.startswith('microco.services')"
        " or m.startswith('prometheus_client') or m.startswith('grpc_health.v1'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("tool_root", ["protos/microco"])
def test_the_import_root_resolves_statically(tool_root):
    """Static tools follow ``microco.*`` from the checkout: every top-level code folder is reachable
    under the import root by a relative link, and the root ships ``py.typed``."""
    root = REPO / tool_root
    assert (root / "py.typed").is_file()
    for name, path in ROOTS.items():
        linked = root / name.split(".", 1)[1]
        assert linked.resolve() == path.resolve(), name
        if linked.is_symlink():
            assert not os.path.isabs(os.readlink(linked)), f"{linked} must be a relative link"
