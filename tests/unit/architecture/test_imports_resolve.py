"""Every ``microco.*`` import in the checkout names a module that exists, the lazy ones inside
functions included: a layout move that leaves ``from .hotstate import ...`` behind in a function
otherwise only fails when that code path first runs (a service's ``ctx.redis``, in production)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

ROOTS = {
    "microco.api": REPO / "protos" / "microco" / "api",
    "microco.common": REPO / "common",
    "microco.clients": REPO / "clients",
    "microco.services": REPO / "services",
    "microco.cli": REPO / "cli",
    "microco.benchmarks": REPO / "benchmarks",
    "microco.examples": REPO / "examples",
}


def _exists(module: str) -> bool:
    for root, path in ROOTS.items():
        if module == root or module.startswith(root + "."):
            rest = module[len(root) :].lstrip(".").split(".") if module != root else []
            where = path.joinpath(*rest)
            return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()
    return True  # microco itself or a root this test does not know: not its business


def _module_name(root: str, path: Path, file: Path) -> tuple[str, str]:
    """(module, package) of ``file`` under ``root``."""
    rel = file.relative_to(path).with_suffix("")
    parts = [root, *rel.parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _unresolved(roots: dict[str, Path]) -> list[str]:
    bad = []
    for root, path in roots.items():
        for dirpath, _, files in os.walk(path):
            for f in files:
                if not f.endswith(".py") or "_pb2" in f:
                    continue
                file = Path(dirpath) / f
                _, package = _module_name(root, path, file)
                for node in ast.walk(ast.parse(file.read_text(), str(file))):
                    targets: list[str] = []
                    if isinstance(node, ast.Import):
                        targets = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        if node.level:
                            base = package.split(".")[: len(package.split(".")) - node.level + 1]
                            target = ".".join(base + ([node.module] if node.module else []))
                        else:
                            target = node.module or ""
                        # ``from pkg import name``: ``pkg`` must exist (``name`` may be an attribute)
                        targets = [target]
                    for t in targets:
                        if t.startswith("microco.") and not _exists(t):
                            shown = file.relative_to(REPO) if file.is_relative_to(REPO) else file
                            bad.append(f"{shown}:{node.lineno} imports {t}, which does not exist")
    return bad


def test_every_microco_import_names_an_existing_module() -> None:
    assert _unresolved(ROOTS) == []


def test_the_check_finds_a_lazy_import_of_a_moved_module(tmp_path: Path) -> None:
    pkg = tmp_path / "services" / "runtime"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text("def redis():\n    from .hotstate import connect_redis\n")
    found = _unresolved({"microco.services": tmp_path / "services"})
    assert len(found) == 1 and "microco.services.runtime.hotstate" in found[0]
