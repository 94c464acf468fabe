"""The checkout's Python modules and the ``microco.*`` imports each one makes, read with ``ast``
(nothing is imported): what the architecture tests check."""

from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# Where each import root's code lives in the checkout.
ROOTS = {
    "microco.api": REPO / "protos" / "microco" / "api",
    "microco.common": REPO / "common",
    "microco.clients": REPO / "clients",
    "microco.services": REPO / "services",
    "microco.cli": REPO / "cli",
    "microco.benchmarks": REPO / "benchmarks",
    "microco.examples": REPO / "examples",
}


def modules(roots: dict[str, Path] | None = None) -> list[tuple[str, Path]]:
    """(dotted module name, file) of every hand-written module under ``roots``."""
    out = []
    for root, path in (ROOTS if roots is None else roots).items():
        for dirpath, _, files in os.walk(path):
            for f in files:
                if not f.endswith(".py") or "_pb2" in f:
                    continue
                p = Path(dirpath) / f
                parts = list(p.relative_to(path).with_suffix("").parts)
                if parts and parts[-1] == "__init__":
                    parts = parts[:-1]
                out.append((".".join([root, *parts]), p))
    return out


def imports(module: str, path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names taken from it) of every ``microco.*`` import in ``path``,
    the lazy ones inside functions included; relative imports resolved against ``module``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target, [a.name for a in node.names]))
    return [
        (line, t, names)
        for line, t, names in found
        if t.startswith("microco.") and not t.startswith("microco.__")
    ]


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path
