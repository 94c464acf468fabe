"""Analysts' files as streams of Arrow record batches, for ``create --from`` and ``load``.

What public data comes as: Parquet; CSV, TSV and TPC's ``.tbl``; JSON lines (``.json``,
``.jsonl``, ``.ndjson``); each of the text formats compressed (``.gz``, ``.bz2``, ``.zst``,
``.lz4``: decompressed as read); one file, a directory of them (Spark's and Hive's layouts:
``year=2023/month=1/part-0.parquet`` gives the columns ``year`` and ``month``; names starting
with ``_`` or ``.`` such as ``_SUCCESS`` are skipped) or a glob (``'data/*.csv.gz'``; under
Hive-style folders the folders' columns too, whatever part of them it names). Every
source is read batch by batch: a load holds one batch in client memory, never the whole file.

Types. A streaming reader infers a CSV's or JSON's types from its first block (8 MB), so a
column whose first million values are integers and whose later ones are not (``1.5``, ``n/a``)
broke a load half-way. So:

* into an existing table, text is parsed with **the table's types** and every batch (Parquet's
  and a Hive folder's too) is conformed to the table's schema: its columns by name, in the
  table's order, cast where the cast is exact (``int32`` -> ``int64``); a value that does not
  fit is refused naming the file, the column and the type, before anything is committed;
* ``create --from`` a CSV infers over **the whole file**, streaming: a column whose later value
  does not fit its first-block type is widened (integer -> float -> string; any other -> string)
  and the file read again, so the table gets types every row fits; a JSON file is inferred by
  reading it whole (pyarrow's JSON reader names no column in its errors).
"""

from __future__ import annotations

import glob as _glob
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from microco.common.errors import InvalidArgument

COMPRESSIONS = (".gz", ".bz2", ".zst", ".lz4")
FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".tbl": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
DELIMITERS = {".tsv": "\t", ".tbl": "|"}
TBL_END = "__tbl_end"  # the empty field after a .tbl line's last delimiter
_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)  # a value that does not fit
_READ_ERRORS = (*_CAST_ERRORS, OSError)  # ... or a file that cannot be read
KINDS = "Parquet (.parquet), CSV (.csv, .tsv, .tbl) and JSON lines (.json, .jsonl, .ndjson), text compressed or not"


def _suffix(p: Path) -> tuple[str, str]:
    """(format suffix, compression suffix) of a file's name."""
    suffixes = [s.lower() for s in p.suffixes]
    comp = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else ""
    return (suffixes[-1] if suffixes else ""), comp


def file_kind(p: Path) -> str:
    fmt, comp = _suffix(p)
    kind = FORMATS.get(fmt)
    if kind is None or (kind == "parquet" and comp):
        raise InvalidArgument(f"{p}: only {KINDS} can be loaded")
    return kind


def sources(path: str | Path) -> tuple[list[Path], Path | None]:
    """The files a path names (one file, a directory's files, a glob's matches), in name order,
    and the directory they are under when it is one (for Hive-style ``key=value`` folders)."""
    text = str(path)
    p = Path(text)
    if p.is_dir():
        files = sorted(
            f
            for f in p.rglob("*")
            if f.is_file() and not any(part.startswith(("_", ".")) for part in f.relative_to(p).parts)
        )
        if not files:
            raise InvalidArgument(f"{p}: a directory with no data files")
        return files, p
    if any(ch in text for ch in "*?["):
        files = sorted(Path(f) for f in _glob.glob(text, recursive=True) if Path(f).is_file())
        if not files:
            raise InvalidArgument(f"no file matches {text!r}")
        # Under Hive-style folders (``t/year=2022/month=1/x.parquet``), the folder above the
        # first ``key=value`` one is the root, whatever part of them the pattern names.
        roots = {_hive_root(f) for f in files}
        return files, (roots.pop() if len(roots) == 1 else None)
    if not p.exists():
        raise InvalidArgument(f"no such file: {p}")
    return [p], None


def _hive_root(f: Path) -> Path | None:
    """The folder above a file's ``key=value`` folders, None when it is in none."""
    root, seen = f.parent, False
    while "=" in root.name:
        root, seen = root.parent, True
    return root if seen else None


def _kind_of(files: list[Path]) -> str:
    kinds = {file_kind(f) for f in files}
    if len(kinds) > 1:
        raise InvalidArgument(f"one load reads one format; these files mix {', '.join(sorted(kinds))}")
    return kinds.pop()


def _csv_options(p: Path, schema: pa.Schema | None, block: int) -> dict[str, Any]:
    """pyarrow's CSV options for ``p``, with ``schema``'s types (and, for a ``.tbl``, names)."""
    import pyarrow.csv as pcsv

    fmt, _ = _suffix(p)
    types = {f.name: f.type for f in schema} if schema is not None else {}
    read = pcsv.ReadOptions(block_size=block)
    convert = pcsv.ConvertOptions(column_types=types, strings_can_be_null=True)
    if fmt == ".tbl":
        # TPC's dbgen layout (tpchgen's too): no header, and every line ends with the delimiter.
        if schema is None:
            raise InvalidArgument(
                f"{p}: a .tbl file has no header to name its columns: create the table with "
                "--schema NAME:TYPE,... and load the file into it"
            )
        read = pcsv.ReadOptions(block_size=block, column_names=[*schema.names, TBL_END])
        convert = pcsv.ConvertOptions(
            column_types=types, strings_can_be_null=True, include_columns=schema.names
        )
    return {
        "read_options": read,
        "parse_options": pcsv.ParseOptions(delimiter=DELIMITERS.get(fmt, ",")),
        "convert_options": convert,
    }


def _one_file(
    p: Path, schema: pa.Schema | None, batch_rows: int, block: int
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    kind = file_kind(p)
    if kind == "parquet":
        import pyarrow.parquet as pq

        f = pq.ParquetFile(p)
        return f.schema_arrow, f.iter_batches(batch_size=batch_rows)
    if kind == "csv":
        import pyarrow.csv as pcsv

        reader = pcsv.open_csv(p, **_csv_options(p, schema, block))
        return reader.schema, iter(reader)
    import pyarrow.json as pjson

    parse = pjson.ParseOptions(explicit_schema=schema) if schema is not None else None
    jreader = pjson.open_json(p, read_options=pjson.ReadOptions(block_size=block), parse_options=parse)
    return jreader.schema, iter(jreader)


def _folder_columns(f: Path, root: Path | None) -> list[tuple[str, str]]:
    """The ``key=value`` folders between ``root`` and file ``f`` (Hive's layout), in order."""
    if root is None:
        return []
    out = []
    for part in f.relative_to(root).parts[:-1]:
        key, eq, value = part.partition("=")
        if eq and key:
            out.append((key, value))
    return out


def _folder_type(values: list[str]) -> pa.DataType:
    """A folder column's type: integers when every value is one, else strings."""
    try:
        for v in values:
            int(v)
    except ValueError:
        return pa.string()
    return pa.int64()


def _exploded(
    files: list[Path],
    root: Path | None,
    schema: pa.Schema | None,
    batch_rows: int,
    block: int,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Several files (or one under ``key=value`` folders) read one after another, each batch
    with its folders' columns added (values as strings; typed by the table's schema, else
    ``_folder_type``)."""
    _kind_of(files)
    folders = [_folder_columns(f, root) for f in files]
    keys = list(dict.fromkeys(k for cols in folders for k, _ in cols))
    for f, cols in zip(files, folders, strict=True):
        if [k for k, _ in cols] != keys:
            raise InvalidArgument(f"{f}: its folders name {[k for k, _ in cols]}, others {keys}")
    # The files themselves hold the table's columns but the folders'.
    inner = pa.schema([x for x in schema if x.name not in keys]) if schema is not None else None
    first, _ = _one_file(files[0], inner, batch_rows, block)
    types = {k: _folder_type([dict(cols)[k] for cols in folders]) for k in keys}
    whole = pa.schema([*first, *(pa.field(k, types[k]) for k in keys)])

    def batches() -> Iterator[pa.RecordBatch]:
        for f, cols in zip(files, folders, strict=True):
            _schema, it = _one_file(f, inner, batch_rows, block)
            for b in it:
                arrays = [
                    *b.columns,
                    *(pa.array([v] * b.num_rows, pa.string()).cast(types[k]) for k, v in cols),
                ]
                yield pa.RecordBatch.from_arrays(arrays, names=[*b.schema.names, *keys])

    return whole, batches()


def read_source(
    path: str | Path,
    schema: pa.Schema | None = None,
    *,
    batch_rows: int = 65_536,
    csv_block_bytes: int = 8 << 20,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """``path``'s rows as a schema and a lazy stream of record batches. With ``schema`` (the
    table's), text is parsed with its types and every batch conformed to it (``conform``)."""
    files, root = sources(path)
    single = len(files) == 1 and not _folder_columns(files[0], root)
    label = str(files[0]) if single else f"{path} ({len(files)} files)"
    try:  # (a reader parses its first block as it opens)
        if single:
            got, batches = _one_file(files[0], schema, batch_rows, csv_block_bytes)
        else:
            got, batches = _exploded(files, root, schema, batch_rows, csv_block_bytes)
    except _READ_ERRORS as exc:
        raise InvalidArgument(f"{label}: {_first_line(exc)}") from exc
    if schema is None:
        return got, _explained(batches, label)
    return schema, (conform(b, schema, label) for b in _explained(batches, label))


def _first_line(exc: BaseException) -> str:
    """A reader's message without the data some of them quote after it."""
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__


def _explained(batches: Iterator[pa.RecordBatch], label: str) -> Iterator[pa.RecordBatch]:
    """The reader's own errors (a value that does not parse, a truncated file) as an
    ``InvalidArgument`` that names the file."""
    try:
        yield from batches
    except _READ_ERRORS as exc:
        raise InvalidArgument(f"{label}: {_first_line(exc)}") from exc


def conform(batch: pa.RecordBatch, schema: pa.Schema, label: str = "") -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns, by name and in its order, each cast exactly (a value
    that does not fit is refused: ``InvalidArgument`` naming the column)."""
    if batch.schema.equals(schema):
        return batch
    names = set(batch.schema.names)
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in batch.schema.names if n not in set(schema.names)]
    where = f"{label}: " if label else ""
    if missing or extra:
        raise InvalidArgument(
            f"{where}the columns differ from the table's: "
            + "; ".join(
                x
                for x in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"not in the table: {', '.join(extra)}" if extra else "",
                )
                if x
            )
        )
    arrays = []
    for field in schema:
        col = batch.column(field.name)
        if not col.type.equals(field.type):
            try:
                col = col.cast(field.type, safe=True)
            except _CAST_ERRORS as exc:
                raise InvalidArgument(
                    f"{where}column {field.name!r} holds {col.type} values that are not {field.type} "
                    f"(the table's type): {exc}"
                ) from exc
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


_COLUMN = re.compile(r"column #(\d+)")


def _wider(t: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(t):
        return pa.float64()
    return pa.string()


def infer_schema(path: str | Path, *, csv_block_bytes: int = 8 << 20) -> pa.Schema:
    """The schema of ``path``'s rows that every row fits (see the module's doc): Parquet's from
    its footers, a CSV's over the whole file, a JSON file's by reading it."""
    files, root = sources(path)
    kind = _kind_of(files)
    if kind == "json":
        import pyarrow.json as pjson

        if len(files) == 1 and root is None:
            try:
                return pjson.read_json(files[0]).schema
            except pa.ArrowInvalid as exc:
                raise InvalidArgument(f"{files[0]}: {exc}") from exc
    if kind != "csv" or len(files) > 1 or root is not None:
        return read_source(path, csv_block_bytes=csv_block_bytes)[0]
    import pyarrow.csv as pcsv

    p = files[0]
    schema = pcsv.open_csv(p, **_csv_options(p, None, csv_block_bytes)).schema
    for _ in range(2 * len(schema) + 1):
        try:
            for _batch in pcsv.open_csv(p, **_csv_options(p, schema, csv_block_bytes)):
                pass
            return schema
        except pa.ArrowInvalid as exc:
            m = _COLUMN.search(str(exc))
            if m is None or int(m.group(1)) >= len(schema):
                raise InvalidArgument(f"{p}: {exc}") from exc
            i = int(m.group(1))
            field = schema.field(i)
            if pa.types.is_string(field.type):
                raise InvalidArgument(f"{p}: {exc}") from exc
            schema = schema.set(i, field.with_type(_wider(field.type)))
    raise InvalidArgument(f"{p}: could not settle the columns' types")
