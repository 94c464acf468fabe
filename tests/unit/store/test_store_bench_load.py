"""A file's append deadline grows with the file: scale factor 10's lineitem (2.5 GB of Parquet)
took over the client's fixed 600 s to append on this machine, and the run failed with
DeadlineExceeded after 16 minutes of loading. The benchmark was fixed first; `microco store load`
(and `StoreClient.append` of a file) kept the fixed 600 s. No sockets: the gRPC stub is replaced."""

from __future__ import annotations

import contextlib

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from microco.benchmarks.store import load_timeout
from microco.cli import build_parser
from microco.clients.store import (
    LOAD_FLOOR_S,
    LOAD_MIN_MB_PER_S,
    LoadProgress,
    StoreClient,
    file_deadline_s,
    file_rows,
    load_deadline_s,
)
from microco.common.errors import DeadlineExceeded, InvalidArgument


def _sparse(path, size):  # a file of `size` bytes without writing them
    with open(path, "wb") as out:
        out.truncate(size)
    return path


def test_small_files_keep_the_default_deadline(tmp_path):
    f = tmp_path / "t.parquet"
    f.write_bytes(b"x" * 1000)
    assert load_timeout(f) == file_deadline_s(f) == LOAD_FLOOR_S == 600.0


def test_a_big_file_gets_time_at_the_slowest_load_rate(tmp_path):
    f = _sparse(tmp_path / "lineitem.parquet", 2_500_000_000)  # scale factor 10's lineitem
    assert load_timeout(f) == file_deadline_s(f) == 2500 / LOAD_MIN_MB_PER_S > 600


def test_deadline_rule():
    assert load_deadline_s(0) == LOAD_FLOOR_S
    assert load_deadline_s(300_000_000) == LOAD_FLOOR_S  # exactly the floor at 0.5 MB/s
    assert load_deadline_s(300_000_001) > LOAD_FLOOR_S
    assert load_deadline_s(10_000_000, floor_s=1, min_mb_per_s=2) == 5.0
    with pytest.raises(InvalidArgument, match="negative"):
        load_deadline_s(-1)
    with pytest.raises(InvalidArgument, match="positive"):
        load_deadline_s(1, min_mb_per_s=0)
    with pytest.raises(InvalidArgument, match="no such file"):
        file_deadline_s("/nonexistent/t.parquet")


class _RpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "Deadline Exceeded"


class _Stub:
    """The Append RPC: reads `take` requests of the stream, then answers or fails."""

    def __init__(self, fail=None, take=None):
        self.fail, self.take, self.timeouts = fail, take, []

    def GetTable(self, req, *args, **kwargs):  # a file is read with the table's types
        from microco.api.store.v1 import store_pb2 as pb

        schema = pa.schema([("k", pa.int64())])
        return pb.Table(name=req.name, arrow_schema=schema.serialize().to_pybytes())

    def Append(self, requests, timeout):
        self.timeouts.append(timeout)
        for k, _ in enumerate(requests):
            if self.take is not None and k + 1 >= self.take:
                break
        if self.fail:
            raise _RpcError(self.fail)
        return type("R", (), {"rows": 3, "bytes": 24, "super_extents": [0]})()


def _client(stub):
    c = StoreClient(grpc.insecure_channel("localhost:1"), default_timeout=10)  # never dialled
    c._stub = stub
    return c


def _parquet(path, rows, batch=1000):
    pq.write_table(pa.table({"k": list(range(rows))}), path, row_group_size=batch)
    return path


def test_append_of_a_file_takes_the_files_deadline_and_counts_rows(tmp_path, monkeypatch):
    f = _parquet(tmp_path / "t.parquet", 5000)
    stub = _Stub()
    seen = []
    progress = LoadProgress(file_rows(f), on_batch=seen.append)
    _client(stub).append("t", f, progress=progress)
    assert 590 < stub.timeouts[0] <= 600  # the file's deadline (the floor here), not default_timeout
    assert progress.rows == sum(seen) == 5000 == progress.total_rows
    # a big file: the deadline the file's size gives (what `microco store load` got: 600 s fixed)
    monkeypatch.setattr("microco.clients.store._client.file_deadline_s", lambda p: 5000.0)
    _client(stub).append("t", f)
    assert 4990 < stub.timeouts[1] <= 5000
    # an explicit timeout wins; a table (not a file) keeps the long-call default
    _client(stub).append("t", f, timeout=42)
    _client(stub).append("t", pa.table({"k": [1]}))
    assert 40 < stub.timeouts[2] <= 42 and 590 < stub.timeouts[3] <= 600


def test_a_load_out_of_time_says_how_far_it_got(tmp_path, monkeypatch):
    monkeypatch.setattr("microco.clients.store._client.CHUNK", 4096)  # pieces of 4 kB
    f = _parquet(tmp_path / "t.parquet", 200_000)  # read 65,536 rows a batch
    progress = LoadProgress(file_rows(f))
    stub = _Stub(fail=grpc.StatusCode.DEADLINE_EXCEEDED, take=1)
    with pytest.raises(
        DeadlineExceeded,
        match=r"append to t ran out of its 7 s deadline; [\d,]+ of 200,000 rows sent; nothing",
    ):
        _client(stub).append("t", f, timeout=7, progress=progress)
    assert 0 < progress.rows < 200_000  # cut off after the first piece


def test_cli_load_passes_the_files_deadline_and_shows_progress(tmp_path, monkeypatch, capsys):
    f = _parquet(tmp_path / "t.parquet", 2000)
    got = {}

    class Fake:
        def append(self, name, path, timeout, progress):
            got.update(name=name, timeout=timeout, total=progress.total_rows)
            for b in pq.ParquetFile(path).iter_batches(batch_size=500):
                progress.on_batch(b.num_rows)  # what LoadProgress.wrap calls: the bar's update
            return {"rows": 2000, "bytes": 16000, "super_extents": [0]}

    monkeypatch.setattr("microco.cli.store._client", lambda args: contextlib.nullcontext(Fake()))
    monkeypatch.setattr("microco.clients.store.file_deadline_s", lambda p: 1234.0)
    args = build_parser().parse_args(["store", "load", "t", str(f)])
    assert args.func(args) == 0
    assert got == {"name": "t", "timeout": 1234.0, "total": 2000}
    out = capsys.readouterr()
    assert (
        "loaded 2,000 rows into t" in out.out and "2.00k/2.00k" in out.err
    )  # the bar reached the file's rows
    args = build_parser().parse_args(["store", "load", "t", str(f), "--timeout", "99"])
    args.func(args)
    assert got["timeout"] == 99.0
    with pytest.raises(InvalidArgument, match="--timeout must be positive"):
        args = build_parser().parse_args(["store", "load", "t", str(f), "--timeout", "0"])
        args.func(args)


def test_bench_refuses_a_run_with_nothing_to_run(capsys):
    from microco.benchmarks.store import main

    with pytest.raises(SystemExit):
        main(["--tpch-only", "--no-tpch"])
    assert "leave nothing to run" in capsys.readouterr().err


def test_bench_runs_a_chosen_subset_of_tpch_and_refuses_unknown_query_numbers(capsys):
    from microco.benchmarks.store import _query_numbers, main

    assert _query_numbers("6,1") == [6, 1]
    for bad in ("0", "23", "q6", ""):
        with pytest.raises(SystemExit):
            main(["--tpch-only", "--tpch-queries", bad])
        assert "--tpch-queries" in capsys.readouterr().err
