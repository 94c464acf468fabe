"""Two jobs of one dataset through one real cache server: a chunk one job is reading whole
from the backing store is not read by the other, which reads it as a hit once inserted."""

from __future__ import annotations

import threading

import pytest
from _support import wait_until

from microco.clients.cache import CacheClient, QuiverLoader, digest
from microco.common.errors import InvalidArgument
from microco.services.cache import LocalStore, build_index


class _Store:
    """A backing store that counts the paths read, and can hold reads until released."""

    def __init__(self, inner, gate: threading.Event | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.paths: list[str] = []
        self.gate = gate

    def list_files(self):
        return self.inner.list_files()

    def read(self, path):
        if self.gate is not None:
            assert self.gate.wait(60), "never released"
        self.paths.append(path)
        return self.inner.read(path)


def _until(cond, what: str) -> None:
    wait_until(cond, 60, what, interval=0.005)


def test_a_chunk_in_flight_for_one_job_is_not_read_by_the_other(make_dataset, tmp_path, inproc_cache):
    files = make_dataset(tmp_path / "d", n=32, size=1000)
    address, core = inproc_cache(1 << 20)  # room for the whole dataset
    core.max_wait_s = 60  # (a bound: the test releases the first job once the second waits)
    local = LocalStore(str(tmp_path / "d"))
    idx = build_index(local.list_files(), local.read, 8000)  # 4 chunks of 8 samples
    gate = threading.Event()
    slow, other = _Store(local, gate), _Store(local)
    kw = dict(dataset="d", server=address, prefetch=False, prefetch_batches=0)
    first = QuiverLoader(idx, slow, batch_size=1, job_id="first", **kw)
    second = QuiverLoader(idx, other, batch_size=4, job_id="second", **kw)
    second.CLAIM_WAIT_S = 60
    got: list[list[int]] = []
    try:
        # The first job misses one sample and reads its chunk whole: claimed, then held.
        reader = threading.Thread(target=lambda: got.append(list(next(iter(first.epoch(0)))[0])))
        reader.start()
        _until(lambda: len(core.claims) == 1, "the first job did not claim its chunk")
        (claimed,) = core.claims._held
        chunk = idx.chunk_by_digest(claimed)
        members = {s.path for s in idx.samples_of(chunk)}
        # The second job reads the epoch: its other misses first, then it waits for the chunk.
        seen: list[int] = []

        def read_second() -> None:
            for indices, samples in second.epoch(0):
                assert samples == [files[idx.samples[i].path] for i in indices]
                seen.extend(indices)

        t2 = threading.Thread(target=read_second)
        t2.start()
        _until(lambda: core._waiters == 1 or not t2.is_alive(), "the second job did not wait")
        gate.set()
        t2.join(60)
        reader.join(60)
        assert not t2.is_alive() and not reader.is_alive()
        assert sorted(seen) == list(range(32))  # every sample once
        assert not members & set(other.paths), "the second job read the chunk in flight"
        assert len(other.paths) == 32 - len(members)  # and every other sample once
        assert second.claim_waits >= 1 and second.claim_waited >= 1
        assert got and idx.samples[got[0][0]].path in members
        assert sorted(slow.paths) == sorted(members)  # the chunk read once, by its claimer
        _until(lambda: len(core.claims) == 0, "a claim outlived its put")  # nothing left in flight
    finally:
        gate.set()
        first.close()
        second.close()


def test_a_claim_needs_a_job_and_bounded_seconds_over_grpc(inproc_cache):
    address, _core = inproc_cache(1 << 20)
    d = digest(b"x")
    with CacheClient(address) as c:
        ans = c.lookup_claim([d], "d", "j1", claim=[d], lease_s=5)
        assert ans.claimed == {d} and not ans.present and not ans.in_flight
        assert c.lookup_claim([d], "d", "j2", claim=[d]).in_flight == {d}
        with pytest.raises(InvalidArgument, match="job_id"):
            c.lookup_claim([d], "d", "", claim=[d])
        with pytest.raises(InvalidArgument, match="wait_s"):
            c.lookup_claim([d], "d", "j2", wait_s=-1)
