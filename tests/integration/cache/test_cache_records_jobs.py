"""Datasets of records as users keep them, through a real etcd and a real cache server: TFRecord
shards written by TensorFlow's own writer, registered with ``microco cache register --records
tfrecord`` and read by tf.data (``tf.io.parse_example`` on each batch); WebDataset tar shards
read by PyTorch ``DataLoader`` worker processes. Every record once per epoch, the second epoch
served from the cache."""

from __future__ import annotations

import io
import json
import random
import tarfile

import pytest

from microco.cli import main
from microco.clients.cache import get_dataset, open_loader

pytestmark = pytest.mark.integration


@pytest.mark.tensorflow
def test_tfrecord_shards_one_sample_per_example(tmp_path, etcd_endpoint, etcd_kv, cache_server, capsys):
    tf = pytest.importorskip("tensorflow")
    rng = random.Random(3)
    want = {}
    (tmp_path / "tfr").mkdir()
    for shard in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / "tfr" / f"train-{shard}-of-2.tfrecord")) as w:
            for i in range(60):
                n = shard * 60 + i
                vals = [rng.random() for _ in range(rng.randint(1, 20))]
                ex = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[n])),
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=vals)),
                        }
                    )
                )
                w.write(ex.SerializeToString())
                want[n] = len(vals)
    server = cache_server(capacity="1M")
    e = ["cache", "--etcd", etcd_endpoint]
    argv = [
        *e,
        "register",
        "tfr",
        str(tmp_path / "tfr"),
        "--records",
        "tfrecord",
        "--chunk-size",
        "2K",
        "--json",
    ]
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["num_samples"] == 120 and rec["records"] == "tfrecord" and rec["num_chunks"] > 2
    assert get_dataset(etcd_kv, "tfr").records == "tfrecord"
    assert main([*e, "register", "bad", str(tmp_path / "tfr"), "--records", "parquet"]) == 1
    assert "unknown record format" in capsys.readouterr().err

    from microco.clients.cache import quiver_tf_dataset

    loader = open_loader(
        etcd_kv, "tfr", server=server.address, batch_size=16, job_id="tfr-job", prefetch=False
    )
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.VarLenFeature(tf.float32)}
    try:
        for epoch in range(2):
            seen = {}
            ds = quiver_tf_dataset(loader, epoch=epoch).map(lambda i, s: (i, tf.io.parse_example(s, spec)))
            for _indices, parsed in ds:
                counts = tf.RaggedTensor.from_sparse(parsed["x"]).row_lengths()
                for n, c in zip(parsed["id"].numpy().tolist(), counts.numpy().tolist(), strict=True):
                    assert n not in seen
                    seen[n] = c
            assert seen == want, epoch  # every example once, whole
        assert loader.stats.hits >= 120  # the second epoch from the cache
    finally:
        loader.close()


def _decode_tar(data: bytes, path: str) -> tuple[str, int, bytes]:
    from microco.clients.cache import tar_sample

    m = tar_sample(data)
    return path, int(m["cls"]), m["jpg"]


@pytest.mark.torch
def test_webdataset_shards_read_by_dataloader_workers(tmp_path, etcd_kv, cache_server):
    pytest.importorskip("torch")
    from microco.clients.cache import make_dataloader, register_dataset

    rng = random.Random(5)
    want = {}
    (tmp_path / "wds").mkdir()
    for shard in range(3):
        with tarfile.open(tmp_path / "wds" / f"shard-{shard:06d}.tar", "w") as tf:
            for i in range(30):
                key = f"{shard:02d}{i:04d}"
                img = rng.randbytes(rng.randint(50, 900))
                want[int(key)] = img
                for ext, data in (("cls", key.encode()), ("jpg", img)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    # A server process, as a job meets one (gRPC's fork handlers: see test_cache_workers.py).
    server = cache_server(capacity="1M")
    register_dataset(etcd_kv, "wds", str(tmp_path / "wds"), chunk_bytes=8000, records="tar")
    loader = open_loader(etcd_kv, "wds", server=server.address, batch_size=8, job_id="wds-job")
    try:
        assert len(loader.index) == 90
        dl = make_dataloader(loader, transform=_decode_tar, num_workers=2, multiprocessing_context="fork")
        for epoch in range(2):
            dl.batch_sampler.set_epoch(epoch)
            got = {cls: img for batch in dl for _path, cls, img in batch}
            assert got == want, epoch  # every sample once, its members whole
    finally:
        loader.close()


def test_a_record_changed_after_registration_is_refused_not_served(tmp_path, inproc_cache):
    """A shard rewritten in place (the same size): the prefetcher skips the chunk it cannot
    verify (it raised out of ``warm`` and ended the prefetch thread: found in review, session
    33), and the epoch that meets the record says which one changed."""
    import struct

    from microco.clients.cache import QuiverLoader, build_index
    from microco.clients.cache._backing import LocalStore
    from microco.common.errors import FailedPrecondition

    payloads = [bytes([i]) * 50 for i in range(40)]
    from microco.clients.cache._records import _masked_crc32c

    crc = struct.pack("<I", _masked_crc32c(struct.pack("<Q", 50)))
    raw = b"".join(struct.pack("<Q", len(p)) + crc + p + b"\0" * 4 for p in payloads)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.tfrecord").write_bytes(raw)
    store = LocalStore(str(tmp_path / "d"))
    idx = build_index(store.list_files(), store.read, 500, records="tfrecord")
    changed = bytearray(raw)
    changed[idx.samples[0].start] ^= 0xFF
    (tmp_path / "d" / "x.tfrecord").write_bytes(bytes(changed))
    address, _core = inproc_cache(1 << 20)
    loader = QuiverLoader(idx, store, batch_size=8, dataset="d", job_id="j", server=address, prefetch=False)
    try:
        assert loader.warm() >= 0  # the other chunks are cached; the changed one is not
        with pytest.raises(FailedPrecondition, match="x.tfrecord' at byte 12 changed"):
            for _ in loader.epoch(0):
                pass
    finally:
        loader.close()
