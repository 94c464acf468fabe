"""Resuming an epoch with another number of ranks (the scheduler grew or shrank the job between
the checkpoint and the restart): every sample of the epoch still exactly once, none twice.

In process: loaders with no cache server (``server=False``) over a small local dataset; the
ranks of an exchange are threads (``ThreadExchange``)."""

from __future__ import annotations

import random
import threading

import pytest

from microco.clients.cache import QuiverLoader, ThreadExchange, merge_positions
from microco.services.cache import LocalStore, build_index

N, BATCH = 61, 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("regrow")
    rng = random.Random(7)
    for i in range(N):
        (root / f"s{i:03d}").write_bytes(rng.randbytes(40))
    store = LocalStore(str(root))
    return build_index(store.list_files(), store.read, 200), store


def _loaders(data, world: int, exchange: bool) -> list[QuiverLoader]:
    idx, store = data
    group = ThreadExchange(world) if exchange else None
    return [
        QuiverLoader(
            idx,
            store,
            batch_size=BATCH,
            dataset="d",
            job_id="j",
            server=False,
            seed=3,
            world_size=world,
            rank=r,
            exchange=group.member(r) if group is not None else None,
        )
        for r in range(world)
    ]


def _run(loaders: list[QuiverLoader], epoch: int, steps: int | None = None) -> list[list[list[int]]]:
    """Every rank's batches of ``epoch`` (up to ``steps`` each), ranks as threads."""
    out: list[list[list[int]]] = [[] for _ in loaders]
    errors: list[BaseException] = []

    def go(r: int) -> None:
        try:
            for k, (indices, _data) in enumerate(loaders[r].epoch(epoch)):
                out[r].append(indices)
                if steps is not None and k + 1 == steps:
                    break
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(r,)) for r in range(len(loaders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def _close(loaders: list[QuiverLoader]) -> None:
    for ld in loaders:
        ld.close()


@pytest.mark.parametrize("before,after", [(2, 1), (2, 3), (3, 2), (1, 2)])
def test_exchanging_ranks_resume_with_another_world_size_exactly_once(data, before, after):
    # DDP: rank 0 writes the checkpoint at a step boundary; every rank of the resized job loads it.
    old = _loaders(data, before, exchange=True)
    first = _run(old, 1, steps=3)
    assert len({len(x) for x in first}) == 1  # equal steps
    saved = old[0].state_dict()
    _close(old)
    new = _loaders(data, after, exchange=True)
    for ld in new:
        ld.load_state_dict(saved)
        assert ld.resume_epoch == 1
    rest = _run(new, 1)
    assert len({len(ld) for ld in new} | {len(x) for x in rest}) == 1  # equal steps, as announced
    seen = [i for x in first + rest for b in x for i in b]
    assert sorted(seen) == list(range(N))  # exactly once, none twice
    # And the next epoch is whole again, on the new ranks.
    assert sorted(i for x in _run(new, 2) for b in x for i in b) == list(range(N))
    _close(new)


@pytest.mark.parametrize("before,after", [(2, 3), (3, 1)])
def test_split_ranks_resume_with_another_world_size_from_every_ranks_position(data, before, after):
    # Without the exchange each rank's order depends on its own cache: only every rank's
    # position together is the job's. ``merge_positions`` makes it one.
    old = _loaders(data, before, exchange=False)
    first = _run(old, 0, steps=2)
    states = [ld.state_dict() for ld in old]
    _close(old)
    new = _loaders(data, after, exchange=False)
    with pytest.raises(ValueError, match="merge_positions"):
        new[0].load_state_dict(states[0])
    job = merge_positions(states)
    for ld in new:
        ld.load_state_dict(job)
    mid = _run(new, 0, steps=1)
    # Grown or shrunk again mid-way through the resumed epoch: positions since the resume too.
    again = merge_positions([ld.state_dict() for ld in new])
    _close(new)
    last = _loaders(data, before, exchange=False)
    for ld in last:
        ld.load_state_dict(again)
    rest = _run(last, 0)
    _close(last)
    seen = [i for x in first + mid + rest for b in x for i in b]
    assert sorted(seen) == list(range(N))


def test_a_position_after_the_epoch_resumes_at_the_next_with_any_world_size(data):
    old = _loaders(data, 2, exchange=True)
    _run(old, 0)
    saved = old[0].state_dict()
    _close(old)
    new = _loaders(data, 3, exchange=True)
    for ld in new:
        ld.load_state_dict(saved)
        assert ld.resume_epoch == 1
    _close(new)


def test_merge_positions_refuses_inconsistent_positions(data):
    old = _loaders(data, 2, exchange=False)
    _run(old, 0, steps=1)
    a, b = (ld.state_dict() for ld in old)
    _close(old)
    with pytest.raises(ValueError, match="rank"):
        merge_positions([a])  # rank 1's is missing
    with pytest.raises(ValueError, match="twice"):
        merge_positions([a, {**b, "seen": a["seen"]}])  # the same sample given to two ranks
    with pytest.raises(ValueError, match="epoch"):
        merge_positions([a, {**b, "epoch": 5}])


def test_too_few_samples_left_for_the_new_ranks_is_a_clear_error(data):
    # 1 sample left of the epoch cannot give 3 ranks an equal, non-empty step each (an empty
    # batch would be a NaN loss averaged into every rank's gradients): refused when loaded.
    old = _loaders(data, 1, exchange=True)
    _run(old, 0, steps=N // BATCH)
    saved = old[0].state_dict()
    _close(old)
    assert len(saved["job_seen"]) == N - 1  # type: ignore[arg-type]
    new = _loaders(data, 3, exchange=True)
    with pytest.raises(ValueError, match="1 sample.* 3 ranks"):
        new[0].load_state_dict(saved)
    _close(new)


def test_a_rank_outside_the_world_is_refused(data):
    idx, store = data
    with pytest.raises(ValueError, match="rank"):
        QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=False, world_size=2, rank=5)
