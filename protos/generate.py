"""Generate (or check) the Python code for microco's protos.

The proto path is the import path: ``protos/microco/api/<svc>/v1/<svc>.proto`` declares
``package microco.api.<svc>.v1`` and its generated modules sit beside it, importing as
``microco.api.<svc>.v1.<svc>_pb2``. Generated code is committed; ``--check`` fails when
regenerating would change it (run by the unit tests and CI).

    python protos/generate.py          # regenerate in place
    python protos/generate.py --check  # exit 1 if the committed code is stale
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PROTOS = Path(__file__).resolve().parent
API = PROTOS / "microco" / "api"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted(API.rglob("*.proto"))


def generate(out: Path) -> None:
    """Run protoc (grpcio-tools) on every proto, writing the generated modules under ``out``."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:  # pragma: no cover - dev extra missing
        sys.exit("grpcio-tools is needed: pip install -e '.[dev]'")
    include = Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(PROTOS)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    # Every directory on the way down is a regular package.
    for proto in proto_files():
        d = out / proto.parent.relative_to(PROTOS)
        while d != out / "microco":
            init = d / "__init__.py"
            if not init.exists():
                init.write_text(f'"""Generated from protos/{d.relative_to(out).as_posix()}."""\n')
            d = d.parent


def generated_files(root: Path) -> dict[str, Path]:
    api = root / "microco" / "api"
    found = {}
    for p in api.rglob("*"):
        if p.is_file() and (p.name.endswith(GENERATED_SUFFIXES) or p.name == "__init__.py"):
            found[str(p.relative_to(root))] = p
    return found


def check() -> list[str]:
    """Names of the generated files that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = Path(tmp)
        generate(tmp_root)
        fresh = generated_files(tmp_root)
        committed = generated_files(PROTOS)
        stale = [
            name
            for name in sorted(set(fresh) | set(committed))
            if name not in fresh
            or name not in committed
            or not filecmp.cmp(fresh[name], committed[name], shallow=False)
        ]
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if the committed generated code is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        if stale:
            print("generated code is stale; run `python protos/generate.py`:", *stale, sep="\n  ")
            return 1
        print(f"generated code is up to date ({len(proto_files())} protos)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = Path(tmp)
        generate(tmp_root)
        for old in generated_files(PROTOS).values():
            if old.name != "__init__.py":
                old.unlink()
        for name, path in generated_files(tmp_root).items():
            dest = PROTOS / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists() or not filecmp.cmp(path, dest, shallow=False):
                shutil.copyfile(path, dest)
    print(f"generated {len(proto_files())} protos")
    return 0


if __name__ == "__main__":
    sys.exit(main())
