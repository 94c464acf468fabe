"""Record formats: a sample per record of a file (WebDataset tar, TFRecord, lines, .npy rows,
fixed-size blocks), indexed, serialised and read back by byte range, each checked by digest.

Before record formats a shard was one sample: a TFRecord file of 300 examples was indexed as
one sample, so a loader's "batch" was the whole shard and nothing below it was substitutable."""

from __future__ import annotations

import io
import json
import struct
import tarfile

import numpy as np
import pytest

from microco.clients.cache import LocalStore, build_index, check_format, record_spans, tar_sample
from microco.clients.cache._backing import read_checked, read_run, sample_runs
from microco.clients.cache._index import DatasetIndex
from microco.clients.cache._records import _masked_crc32c
from microco.common.errors import FailedPrecondition, InvalidArgument


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    """A tar shard as WebDataset's writer lays one out: ``key.ext`` members in sample order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tfrecord(payloads: list[bytes]) -> bytes:
    # The framing TFRecordWriter writes (the length's CRC is checked, the payload's is not read:
    # samples are content-hashed).
    return b"".join(
        struct.pack("<Q", len(p))
        + struct.pack("<I", _masked_crc32c(struct.pack("<Q", len(p))))
        + p
        + b"\0" * 4
        for p in payloads
    )


def test_webdataset_tar_members_sharing_a_key_are_one_sample() -> None:
    long_dir = "d" * 120  # a GNU long-name header before the member: still inside its sample
    members = [
        ("a/s1.jpg", b"J1" * 300),
        ("a/s1.cls", b"3"),
        ("a/s2.jpg", b"J2" * 10),
        ("a/s2.cls", b"4"),
        (f"{long_dir}/s3.seg.png", b"P3"),
        (f"{long_dir}/s3.cls", b"5"),
    ]
    data = _tar(members)
    spans = record_spans("tar", data)
    assert len(spans) == 3
    samples = [tar_sample(data[o : o + n]) for o, n in spans]
    assert samples == [
        {"jpg": b"J1" * 300, "cls": b"3"},
        {"jpg": b"J2" * 10, "cls": b"4"},
        {"seg.png": b"P3", "cls": b"5"},
    ]
    with pytest.raises(InvalidArgument, match="not a tar file"):
        record_spans("tar", b"x" * 1000)


def test_tfrecord_payloads_and_malformed_files() -> None:
    payloads = [b"", b"one", b"x" * 5000]
    data = _tfrecord(payloads)
    assert [data[o : o + n] for o, n in record_spans("tfrecord", data)] == payloads
    with pytest.raises(InvalidArgument, match="runs past its end"):
        record_spans("tfrecord", data[:-1])
    with pytest.raises(InvalidArgument, match="gzip"):
        record_spans("tfrecord", b"\x1f\x8b" + data)


def test_lines_npy_and_fixed_blocks() -> None:
    text = b'{"a": 1}\r\n\n{"a": 2}\n{"a": 3}'
    assert [text[o : o + n] for o, n in record_spans("lines", text)] == [
        b'{"a": 1}\r',
        b'{"a": 2}',
        b'{"a": 3}',
    ]
    arr = np.arange(24, dtype=np.int16).reshape(4, 3, 2)
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    rows = [np.frombuffer(data[o : o + n], np.int16).reshape(3, 2) for o, n in record_spans("npy", data)]
    assert len(rows) == 4 and all(np.array_equal(r, arr[i]) for i, r in enumerate(rows))
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(arr))
    with pytest.raises(InvalidArgument, match="Fortran"):
        record_spans("npy", buf.getvalue())
    assert record_spans("fixed:4", b"x" * 12) == [(0, 4), (4, 4), (8, 4)]
    with pytest.raises(InvalidArgument, match="whole number of 4-byte"):
        record_spans("fixed:4", b"x" * 10)
    with pytest.raises(InvalidArgument, match="unknown record format"):
        check_format("parquet")
    with pytest.raises(InvalidArgument):
        check_format("fixed:0")


def test_index_of_records_round_trips_and_whole_file_indexes_keep_their_form(tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.jsonl").write_bytes(b"".join(b'{"i": %d}\n' % i for i in range(50)))
    (tmp_path / "d" / "a.jsonl").write_bytes(b"".join(b'{"j": %d}\n' % i for i in range(30)))
    store = LocalStore(str(tmp_path / "d"))
    idx = build_index(store.list_files(), store.read, 100, records="lines")
    assert len(idx) == 80 and idx.records == "lines"
    assert [s.path for s in idx.samples[:30]] == ["a.jsonl"] * 30  # files in path order
    assert all(s.start >= 0 for s in idx.samples)
    assert sum(c.size for c in idx.chunks) == sum(s.size for s in idx.samples)
    assert all(c.size <= 100 for c in idx.chunks)
    again = DatasetIndex.from_bytes(idx.to_bytes(), idx.digest)
    assert again == idx and again.records == "lines"
    assert json.loads(idx.to_bytes())["version"] == 2
    (tmp_path / "d" / "README").write_text("not a record file")
    with pytest.raises(InvalidArgument, match="README: .*--records tfrecord"):
        build_index(store.list_files(), store.read, 100, records="tfrecord")
    (tmp_path / "d" / "README").unlink()
    # One file, one sample: the form (and so the digest) of an index written before records.
    whole = build_index(store.list_files(), store.read, 100)
    doc = json.loads(whole.to_bytes())
    assert doc["version"] == 1 and "records" not in doc and len(whole) == 2
    assert DatasetIndex.from_bytes(whole.to_bytes(), whole.digest) == whole


def test_records_read_back_by_range_together_and_checked(tmp_path) -> None:
    payloads = [bytes([i]) * (10 + i) for i in range(40)]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.tfrecord").write_bytes(_tfrecord(payloads))
    store = LocalStore(str(tmp_path / "d"))
    idx = build_index(store.list_files(), store.read, 1 << 20, records="tfrecord")
    assert [read_checked(store, s) for s in idx.samples] == payloads

    class Counting:
        url = store.url
        calls = 0

        def read_range(self, path: str, start: int, size: int) -> bytes:
            Counting.calls += 1
            return store.read_range(path, start, size)

    refs = [idx.samples[i] for i in (7, 3, 4, 5, 30)]
    runs = sample_runs(refs)
    # Neighbours in one read (a record and the framing between); 30 lies past 22 records, more
    # bytes than the run's own: a read of its own (tests/unit/cache/test_cache_token_file.py).
    assert [[r.index for r in run] for run in runs] == [[3, 4, 5, 7], [30]]
    got = [b for run in runs for b in read_run(Counting(), run)]  # type: ignore[arg-type]
    assert got == [payloads[i] for i in (3, 4, 5, 7, 30)] and Counting.calls == 2
    # A record changed in place (same size) is refused, not served.
    raw = bytearray((tmp_path / "d" / "x.tfrecord").read_bytes())
    raw[idx.samples[4].start] ^= 0xFF
    (tmp_path / "d" / "x.tfrecord").write_bytes(bytes(raw))
    with pytest.raises(FailedPrecondition, match="at byte"):
        read_run(store, runs[0])


def test_records_through_an_fsspec_url_are_read_by_range() -> None:
    import fsspec

    from microco.clients.cache import open_store

    fs = fsspec.filesystem("memory")
    fs.pipe("/recs-test/part-0.jsonl", b"".join(b'{"i": %d}\n' % i for i in range(20)))
    store = open_store("memory://recs-test")
    idx = build_index(store.list_files(), store.read, 64, records="lines")
    assert [read_checked(store, s) for s in idx.samples] == [b'{"i": %d}' % i for i in range(20)]
    fs.rm("/recs-test", recursive=True)


def test_one_shard_file_is_a_dataset(tmp_path):
    """A single TFRecord or JSON-lines file registers as it is (its folder need not be the
    dataset's): before, a file path was refused as 'dataset directory ... does not exist'."""
    from microco.clients.cache import open_store

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.tfrecord").write_bytes(_tfrecord([b"a", b"bb", b"ccc"]))
    (tmp_path / "d" / "other.tfrecord").write_bytes(_tfrecord([b"zzz"]))
    store = open_store(str(tmp_path / "d" / "train.tfrecord"))
    assert store.url == str(tmp_path / "d" / "train.tfrecord")
    assert store.list_files() == [("train.tfrecord", len(_tfrecord([b"a", b"bb", b"ccc"])))]
    idx = build_index(store.list_files(), store.read, 1 << 20, records="tfrecord")
    assert [read_checked(open_store(store.url), s) for s in idx.samples] == [b"a", b"bb", b"ccc"]


def test_a_folder_as_tfds_writes_it_takes_its_shards_by_glob(tmp_path):
    """TFDS keeps ``dataset_info.json`` and ``features.json`` beside its ``*.tfrecord-NNNNN-of-M``
    shards: registered with ``--records tfrecord`` the JSON files are no TFRecords, and the
    registration was refused; ``include`` takes the shards only, and a record keeps it for
    another host's re-index."""
    from microco.clients.cache import get_dataset, load_index, register_dataset
    from microco.common.kv import MemoryKV

    d = tmp_path / "mnist" / "3.0.1"
    d.mkdir(parents=True)
    for k in range(2):
        (d / f"mnist-train.tfrecord-0000{k}-of-00002").write_bytes(
            _tfrecord([b"x%d%d" % (k, i) for i in range(5)])
        )
    (d / "dataset_info.json").write_text("{}")
    (d / "features.json").write_text("{}")
    kv = MemoryKV()
    with pytest.raises(InvalidArgument, match="dataset_info.json"):
        register_dataset(kv, "mnist", str(d), records="tfrecord", home=str(tmp_path / "h"))
    rec, idx = register_dataset(
        kv, "mnist", str(d), records="tfrecord", include="*.tfrecord-*", home=str(tmp_path / "h")
    )
    assert len(idx) == 10 and rec.include == "*.tfrecord-*"
    # another host (no index kept): indexed again from the record, the same digest
    again = load_index(get_dataset(kv, "mnist"), home=str(tmp_path / "elsewhere"))
    assert again.digest == idx.digest
    with pytest.raises(InvalidArgument, match="no files matching"):
        register_dataset(kv, "none", str(d), include="*.parquet", home=str(tmp_path / "h"))


def test_npy_rows_are_as_wide_as_the_header_says_whatever_the_body() -> None:
    # Session 39: a row's width was the body's size over the row count, so a file cut short (or
    # padded) by a whole number of rows split into rows of the wrong width, served as if sound.
    arr = np.arange(12, dtype=np.int64).reshape(3, 4)
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    with pytest.raises(InvalidArgument, match="short of its 3 rows of 32 bytes"):
        record_spans("npy", data[:-24])
    padded = data + b"\0" * 24  # np.load reads the header's rows and leaves the rest
    rows = [np.frombuffer(padded[o : o + n], np.int64) for o, n in record_spans("npy", padded)]
    assert len(rows) == 3 and all(np.array_equal(r, arr[i]) for i, r in enumerate(rows))
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=">u2").reshape(3, 2))  # big-endian: raw bytes, as stored
    data = buf.getvalue()
    assert [n for _, n in record_spans("npy", data)] == [4, 4, 4]


def test_a_blank_line_of_a_crlf_file_is_no_sample() -> None:
    # Session 39: a CRLF file's blank line (b"\r\n") became a sample of one b"\r", which no
    # JSON-lines reader takes; an LF file's blank line was already skipped.
    text = b'{"a": 1}\r\n\r\n{"a": 2}\r\n\r\n'
    assert [text[o : o + n] for o, n in record_spans("lines", text)] == [b'{"a": 1}\r', b'{"a": 2}\r']
    assert record_spans("lines", b"\r\n\r\n") == []


def test_a_tar_member_that_is_a_link_is_refused_naming_it() -> None:
    # Session 39: a shard written by tar from a folder with hard-linked files (two samples with
    # the same label file) stores the second as a link; its sample's fragment held no bytes for
    # it and tar_sample gave the sample without that member, silently.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("a.cls", b"7"), ("a.jpg", b"A")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("b.cls")
        link.type, link.linkname = tarfile.LNKTYPE, "a.cls"
        tf.addfile(link)
    with pytest.raises(InvalidArgument, match="'b.cls' is a hard link to 'a.cls'"):
        record_spans("tar", buf.getvalue())


def test_a_tfrecord_length_failing_its_checksum_is_refused() -> None:
    # Session 39: the CRCs were not read, so a corrupt length that still framed the file (or a
    # file that only looked like TFRecords) gave records of the wrong bytes. The expected value
    # is TFRecordWriter's for a record of 3 bytes (checked against tf.io.TFRecordWriter).
    assert _masked_crc32c(struct.pack("<Q", 3)) == 0x0E4999B0
    good = _tfrecord([b"abc", b"defgh"])
    bad = bytearray(good)
    bad[8] ^= 0xFF
    with pytest.raises(InvalidArgument, match="offset 0 fails its checksum"):
        record_spans("tfrecord", bytes(bad))


def test_a_compressed_tar_shard_is_refused_saying_so() -> None:
    # Session 39: a .tar.gz WebDataset shard (webdataset reads .tgz) was refused as "not a tar
    # file: truncated header", which names no cause.
    import gzip
    import lzma

    plain = _tar([("a.jpg", b"1")])
    for packed, kind in ((gzip.compress(plain), "gzip"), (lzma.compress(plain), "xz")):
        with pytest.raises(InvalidArgument, match=f"a {kind}-compressed tar.*decompress it first"):
            record_spans("tar", packed)


def test_a_member_twice_in_one_tar_sample_is_refused() -> None:
    # Session 39: tar_sample's {ext: bytes} kept only the last of two "a.jpg" in a row, so the
    # sample silently lost one (WebDataset refuses such a shard).
    data = _tar([("a.jpg", b"1"), ("a.jpg", b"2"), ("a.cls", b"3")])
    with pytest.raises(InvalidArgument, match="'a.jpg' appears twice in one sample"):
        record_spans("tar", data)
    # The same name in two samples apart is two samples, as before.
    apart = _tar([("a.jpg", b"1"), ("b.jpg", b"2"), ("a.jpg", b"3")])
    assert [tar_sample(apart[o : o + n]) for o, n in record_spans("tar", apart)] == [
        {"jpg": b"1"},
        {"jpg": b"2"},
        {"jpg": b"3"},
    ]
