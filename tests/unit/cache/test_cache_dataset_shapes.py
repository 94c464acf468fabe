"""Datasets of shapes their authors did not write (session 39's held-out round): links in the
folder, files gone after registration. Each read is compared with the files read directly."""

from __future__ import annotations

import os

import pytest

from microco.clients.cache import LocalStore, QuiverLoader, build_index
from microco.common.errors import FailedPrecondition, InvalidArgument


def _write(path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_linked_folders_and_files_are_samples_and_a_link_loop_is_walked_once(tmp_path) -> None:
    # A dataset assembled from symbolic links: the linked folder's files were silently left out
    # (os.walk does not follow links by default), so their samples were lost from every epoch.
    root, elsewhere = tmp_path / "d", tmp_path / "elsewhere"
    _write(root / "a", b"a" * 10)
    _write(root / "sub" / "b", b"b" * 20)
    _write(elsewhere / "c", b"c" * 30)
    os.symlink(elsewhere, root / "linked")
    os.symlink(elsewhere, root / "linked-again")  # each link its samples, as for files
    os.symlink(root / "a", root / "a-again")
    os.symlink("..", root / "sub" / "up")  # back to a folder holding it: cut, not a loop
    store = LocalStore(str(root))
    listed = [("a", 10), ("a-again", 10), ("linked-again/c", 30), ("linked/c", 30), ("sub/b", 20)]
    assert store.list_files() == listed
    idx = build_index(store.list_files(), store.read, 1 << 20)
    assert [s.path for s in idx.samples] == [p for p, _ in listed]
    assert [store.read(s.path) for s in idx.samples] == [
        b"a" * 10,
        b"a" * 10,
        b"c" * 30,
        b"c" * 30,
        b"b" * 20,
    ]


def test_a_broken_link_in_the_folder_is_named_at_registration(tmp_path) -> None:
    root = tmp_path / "d"
    _write(root / "a", b"a")
    os.symlink(root / "gone", root / "dangling")
    with pytest.raises(InvalidArgument, match="'dangling' cannot be read.*broken symbolic link"):
        LocalStore(str(root)).list_files()
    os.remove(root / "dangling")
    os.symlink(root / "loop", root / "loop")
    with pytest.raises(InvalidArgument, match="'loop' cannot be read"):
        LocalStore(str(root)).list_files()


@pytest.mark.parametrize("records", ["file", "lines"])
def test_a_file_deleted_after_registration_is_named_when_its_samples_are_read(tmp_path, records) -> None:
    # It surfaced as the store's bare FileNotFoundError (an absolute path on the host, no hint
    # that the dataset's registration is stale), unlike a file changed since.
    root = tmp_path / "d"
    for i in range(6):
        _write(root / f"f{i}", f"{i}\n{i}{i}\n".encode())
    store = LocalStore(str(root))
    idx = build_index(store.list_files(), store.read, 1 << 20, records=records)
    os.remove(root / "f3")
    loader = QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=False, prefetch=False)
    try:
        with pytest.raises(
            FailedPrecondition, match="'f3' is gone from the dataset's backing store.*re-register"
        ):
            for _ in loader.epoch(0):
                pass
        gone = [s.index for s in idx.samples if s.path == "f3"]
        with pytest.raises(FailedPrecondition, match="'f3' is gone"):
            loader.read(gone)
    finally:
        loader.close()


def test_a_named_pipe_in_the_folder_is_refused_not_read_forever(tmp_path) -> None:
    # Registration listed it as a file of 0 bytes and then hung in read(), waiting for a writer.
    root = tmp_path / "d"
    _write(root / "a", b"a")
    os.mkfifo(root / "pipe")
    with pytest.raises(InvalidArgument, match="'pipe' is not a regular file"):
        LocalStore(str(root)).list_files()
    with pytest.raises(InvalidArgument, match="'pipe' is not a regular file"):
        LocalStore(str(root / "pipe")).list_files()  # the one file of a dataset


def test_a_file_deleted_while_the_dataset_is_indexed_is_named(tmp_path) -> None:
    # Between listing and reading (a writer still cleaning its shards up): it surfaced as a bare
    # FileNotFoundError with the host's absolute path.
    root = tmp_path / "d"
    for i in range(3):
        _write(root / f"f{i}", b"x" * (i + 1))
    store = LocalStore(str(root))
    files = store.list_files()
    os.remove(root / "f1")
    with pytest.raises(InvalidArgument, match="f1: gone from the dataset while it was being indexed"):
        build_index(files, store.read, 1 << 20)
