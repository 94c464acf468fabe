"""Dataset indexes belong to the cache (MICROCO_HOME), not the data: nothing is written into
a user's data folder, an index is no more readable than its data, written atomically, and a
refused registration leaves nothing behind. Old indexes beside the data are still read."""

from __future__ import annotations

import os
import stat

import pytest

from microco.clients.cache import get_dataset, load_index, register_dataset
from microco.clients.cache._indexstore import index_dir, index_file
from microco.common.errors import AlreadyExists, FailedPrecondition, NotFound
from microco.common.kv import MemoryKV
from microco.services.cache import LocalStore, index_path


def _data(root, n=6, mode=0o644, salt=b""):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        p = root / f"s{i}.bin"
        p.write_bytes(salt + bytes([i]) * 300)
        p.chmod(mode)
    return root


def _tree(root):
    return sorted((os.path.relpath(os.path.join(d, f), root)) for d, _, fs in os.walk(root) for f in fs)


def test_register_writes_nothing_into_the_data_folder(tmp_path):
    d = _data(tmp_path / "d")
    before = _tree(d)
    d.chmod(0o555)  # a read-only dataset (root would write anyway: the listing is the proof)
    try:
        kv = MemoryKV()
        rec, idx = register_dataset(kv, "ro", str(d), chunk_bytes=1000)
        assert _tree(d) == before and sorted(os.listdir(d)) == sorted(f"s{i}.bin" for i in range(6))
        path = index_file(rec.index_digest)
        assert path.is_file() and str(path).startswith(os.environ["MICROCO_HOME"])
        assert load_index(get_dataset(kv, "ro")) == idx
        assert not [p for p in os.listdir(index_dir()) if not p.endswith(".json")]  # no temp files left
    finally:
        d.chmod(0o755)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_index_is_no_more_readable_than_its_data(tmp_path, mode):
    d = _data(tmp_path / "d", mode=0o644)
    (d / "s3.bin").chmod(mode)  # the most private file decides
    rec, _ = register_dataset(MemoryKV(), "p", str(d), chunk_bytes=1000)
    got = stat.S_IMODE(index_file(rec.index_digest).stat().st_mode)
    assert got & ~mode == 0, (oct(got), oct(mode))
    assert stat.S_IMODE(index_dir().stat().st_mode) == 0o700


def test_refused_reregister_leaves_no_index(tmp_path):
    kv = MemoryKV()
    register_dataset(kv, "x", str(_data(tmp_path / "a")), chunk_bytes=1000)
    before = sorted(os.listdir(index_dir()))
    other = _data(tmp_path / "b", salt=b"other")
    with pytest.raises(AlreadyExists):
        register_dataset(kv, "x", str(other), chunk_bytes=1000)
    assert sorted(os.listdir(index_dir())) == before and _tree(other) == [f"s{i}.bin" for i in range(6)]


def test_old_index_beside_the_data_is_still_read(tmp_path, monkeypatch):
    d = _data(tmp_path / "d")
    kv = MemoryKV()
    rec, idx = register_dataset(kv, "old", str(d), chunk_bytes=1000)
    raw = index_file(rec.index_digest).read_bytes()
    LocalStore(str(d)).write(index_path(rec.index_digest), raw)  # where older versions kept it
    index_file(rec.index_digest).unlink()
    assert load_index(rec) == idx
    (d / index_path(rec.index_digest)).unlink()
    with pytest.raises(NotFound, match="register"):
        load_index(rec, rebuild=False)
    # Registered on another host: indexed again here, once, and kept.
    assert load_index(rec) == idx and index_file(rec.index_digest).is_file()
    (d / "s0.bin").write_bytes(b"changed")
    index_file(rec.index_digest).unlink()
    with pytest.raises(FailedPrecondition, match="changed"):
        load_index(rec)


def test_a_huge_name_is_refused_without_being_echoed(tmp_path):
    from microco.common.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as ei:
        register_dataset(MemoryKV(), "n" * 100_000, str(_data(tmp_path / "d")))
    assert len(str(ei.value)) < 200 and "100000 characters" in str(ei.value)
