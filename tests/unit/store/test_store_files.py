"""The files analysts load (``clients/store/_files.py``), as public data comes: a Hive-partitioned
folder of Parquet (as pyarrow and Spark write it), compressed CSV, JSON lines, a glob; a CSV
whose column changes type after its first block. Held out (session 33): each of these was
refused ("only Parquet and CSV files"), and the type change broke a load half-way with a gRPC
"Exception iterating requests!" and a process abort."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from microco.clients.store import infer_schema, read_source
from microco.clients.store._files import conform
from microco.common.errors import InvalidArgument

TRIPS = pa.table(
    {
        "trip_id": pa.array(range(600), pa.int64()),
        "fare": [i * 0.5 for i in range(600)],
        "year": [2022 + i % 2 for i in range(600)],
        "month": [1 + i % 3 for i in range(600)],
    }
)


def _rows(schema_batches) -> pa.Table:
    schema, batches = schema_batches
    return pa.Table.from_batches(list(batches), schema=schema)


def test_a_hive_partitioned_folder_and_a_glob_of_it_give_the_folders_columns(tmp_path):
    ds.write_dataset(
        TRIPS,
        tmp_path / "trips",
        format="parquet",
        partitioning=["year", "month"],
        partitioning_flavor="hive",
    )
    (tmp_path / "trips" / "_SUCCESS").write_text("")  # Spark's marker: not data
    got = _rows(read_source(tmp_path / "trips", batch_rows=100))
    assert sorted(got.column_names) == sorted(TRIPS.column_names) and got.num_rows == 600
    assert sorted(got.column("trip_id").to_pylist()) == list(range(600))
    # into a table of int64 year/month (the folders' columns infer int32): cast exactly
    got = _rows(read_source(tmp_path / "trips", TRIPS.schema))
    assert got.schema == TRIPS.schema
    assert got.sort_by("trip_id").equals(TRIPS)
    part = _rows(read_source(str(tmp_path / "trips" / "year=2022" / "*" / "*.parquet"), TRIPS.schema))
    assert part.num_rows == 300 and set(part.column("year").to_pylist()) == {2022}


def test_compressed_csv_and_json_lines(tmp_path):
    pcsv.write_csv(TRIPS, tmp_path / "t.csv")
    with open(tmp_path / "t.csv", "rb") as f, gzip.open(tmp_path / "t.csv.gz", "wb") as g:
        g.write(f.read())
    with open(tmp_path / "t.jsonl", "w") as f:
        for r in TRIPS.to_pylist():
            f.write(json.dumps(r) + "\n")
    for name in ("t.csv.gz", "t.jsonl"):
        got = _rows(read_source(tmp_path / name, TRIPS.schema, csv_block_bytes=4096))
        assert got.equals(TRIPS), name
    (tmp_path / "t.parquet.gz").write_bytes(b"")  # Parquet compresses inside: not a gzip of one
    with pytest.raises(InvalidArgument, match="only Parquet"):
        read_source(tmp_path / "t.parquet.gz")
    (tmp_path / "mixed").mkdir()
    pq.write_table(TRIPS, tmp_path / "mixed" / "a.parquet")
    pcsv.write_csv(TRIPS, tmp_path / "mixed" / "b.csv")
    with pytest.raises(InvalidArgument, match="mix csv, parquet"):
        read_source(tmp_path / "mixed")
    with pytest.raises(InvalidArgument, match="no file matches"):
        read_source(str(tmp_path / "nothing-*.csv"))


def _drift(path, n=40_000, change=30_000, value="{}.5"):
    with open(path, "w") as f:
        f.write("id,amount\n")
        for i in range(n):
            f.write(f"{i},{i if i < change else value.format(i)}\n")


def test_a_csv_whose_column_changes_type_after_its_first_block(tmp_path):
    _drift(tmp_path / "d.csv")
    # The whole file decides: integers, then halves: a float column (first block alone: int64).
    assert infer_schema(tmp_path / "d.csv", csv_block_bytes=16 << 10).field("amount").type == pa.float64()
    _drift(tmp_path / "s.csv", value="n/{}")
    assert infer_schema(tmp_path / "s.csv", csv_block_bytes=16 << 10).field("amount").type == pa.string()
    # Into a table whose column is a float: read with the table's type, every row fits.
    table = pa.schema([("id", pa.int64()), ("amount", pa.float64())])
    got = _rows(read_source(tmp_path / "d.csv", table, csv_block_bytes=16 << 10))
    assert got.num_rows == 40_000 and got.column("amount")[-1].as_py() == 39_999.5
    # Into one whose column is an integer: refused, naming the file, the column and the value.
    ints = pa.schema([("id", pa.int64()), ("amount", pa.int64())])
    with pytest.raises(InvalidArgument, match=r"d\.csv: .*column #1.*int64.*'30000\.5'"):
        _rows(read_source(tmp_path / "d.csv", ints, csv_block_bytes=16 << 10))


def test_conform_by_name_with_exact_casts_only():
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    b = pa.record_batch({"b": ["x"], "a": pa.array([7], pa.int32())})
    assert conform(b, schema).to_pylist() == [{"a": 7, "b": "x"}]
    with pytest.raises(InvalidArgument, match="missing b; not in the table: c"):
        conform(pa.record_batch({"a": [1], "c": [2]}), schema)
    with pytest.raises(InvalidArgument, match="column 'a' holds double values that are not int64"):
        conform(pa.record_batch({"a": [1.5], "b": ["x"]}), schema)


def test_tpc_tbl_files_as_tpchgen_writes_them(tmp_path):
    """``.tbl``: no header, and each line ends with the delimiter. Read as a CSV with a header,
    its first row named the columns and the empty last field made one more."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("tpchgen-cli") or str(Path(sys.executable).with_name("tpchgen-cli"))
    if not Path(exe).exists():
        pytest.skip("tpchgen-cli is not installed (the analytics extra)")
    subprocess.run(
        [exe, "-s", "0.01", "-T", "nation", f"--output-dir={tmp_path}"], check=True, capture_output=True
    )
    nation = pa.schema(
        [
            ("n_nationkey", pa.int64()),
            ("n_name", pa.string()),
            ("n_regionkey", pa.int64()),
            ("n_comment", pa.string()),
        ]
    )
    got = _rows(read_source(tmp_path / "nation.tbl", nation))
    assert got.num_rows == 25 and got.schema == nation
    assert got.slice(0, 1).to_pylist()[0]["n_name"] == "ALGERIA"
    with pytest.raises(InvalidArgument, match="no header.*--schema"):
        infer_schema(tmp_path / "nation.tbl")
