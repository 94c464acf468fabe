"""Every ``microco.*`` import in the checkout names a module that exists, the lazy ones inside
functions included: a layout move that leaves ``from .hotstate import ...`` behind in a function
otherwise only fails when that code path first runs (a service's ``ctx.redis``, in production)."""

from __future__ import annotations

from pathlib import Path

from _source import ROOTS, imports, modules, shown


def _exists(module: str, roots: dict[str, Path]) -> bool:
    for root, path in roots.items():
        if module == root or module.startswith(root + "."):
            rest = module[len(root) :].lstrip(".").split(".") if module != root else []
            where = path.joinpath(*rest)
            return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()
    return True  # microco itself or a root this test does not know: not its business


def _unresolved(roots: dict[str, Path]) -> list[str]:
    """``from pkg import name``: ``pkg`` must exist (``name`` may be an attribute)."""
    return [
        f"{shown(path)}:{line} imports {target}, which does not exist"
        for module, path in modules(roots)
        for line, target, _ in imports(module, path)
        if not _exists(target, {**ROOTS, **roots})
    ]


def test_every_microco_import_names_an_existing_module() -> None:
    assert _unresolved(ROOTS) == []


def test_the_check_finds_a_lazy_import_of_a_moved_module(tmp_path: Path) -> None:
    pkg = tmp_path / "services" / "runtime"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text("def redis():\n    from .hotstate import connect_redis\n")
    found = _unresolved({"microco.services": tmp_path / "services"})
    assert len(found) == 1 and "microco.services.runtime.hotstate" in found[0]
