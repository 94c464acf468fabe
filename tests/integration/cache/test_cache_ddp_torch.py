"""Data-parallel ranks under a real ``torch.distributed``: world size and rank come from the
process group, and ``TorchExchange`` (the loader's own gloo group, its collectives in the
reader thread while the training step runs its own on the default group) gives every sample
exactly once with equal steps on every rank; the job's position from rank 0 resumes the epoch
on one rank. Two processes (``torch.multiprocessing.spawn``, CPU); needs PyTorch."""

from __future__ import annotations

import json
import random

import pytest
from _support import run_python

pytestmark = pytest.mark.integration

N, BATCH = 22, 4

# The parent imports no torch (each rank does, once): the test's whole cost is two imports.
SPAWNED = """
import json, random, sys

def work(rank, world, port, root, outdir):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from microco.clients.cache import ExchangeSampler, LocalStore, QuiverLoader, TorchExchange, build_index

    store = LocalStore(root)
    idx = build_index(store.list_files(), store.read, 200)
    plain = QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=False)
    ranks = [plain.world_size, plain.rank, plain.job_id]  # from the process group
    plain.close()
    # The sampler alone, each rank's cache answering at random, differently every call.
    rng = random.Random(rank)
    sampler = ExchangeSampler(len(idx), 4, TorchExchange(), seed=5, substitution=3)
    pure = []
    for e in range(2):
        sampler.start_epoch(e)
        pure.append([list(b.indices) for b in sampler.batches(lambda c: {i for i in c if rng.random() < 0.5})])
    # The loader: its reader thread exchanges on its own group ahead of the step, whose
    # all-reduce (DDP's, in effect) runs on the default group meanwhile.
    ld = QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=False, exchange=TorchExchange())
    loader = []
    for e in range(2):
        batches = []
        for k, (indices, data) in enumerate(ld.epoch(e)):
            assert data == [store.read(idx.samples[i].path) for i in indices]
            t = torch.tensor([float(len(indices))])
            dist.all_reduce(t)
            batches.append(indices)
            if e == 1 and k == 1:
                break  # suspended after two steps of epoch 1
        loader.append(batches)
    state = ld.state_dict()
    ld.close()
    with open(f"{outdir}/rank{rank}.json", "w") as f:
        json.dump({"ranks": ranks, "pure": pure, "loader": loader, "state": state}, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    # What torch.multiprocessing.spawn does, without importing torch a third time here.
    import multiprocessing, socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=work, args=(r, 2, port, sys.argv[1], sys.argv[2])) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    sys.exit(max(abs(p.exitcode) if p.exitcode is not None else 99 for p in procs))
"""


@pytest.mark.torch
def test_torch_exchange_across_two_processes_is_exact_with_equal_steps_and_resumes_on_one_rank(tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch")
    from microco.clients.cache import LocalStore, QuiverLoader, build_index

    rng = random.Random(4)
    root = tmp_path / "d"
    root.mkdir()
    for i in range(N):
        (root / f"s{i:03d}").write_bytes(rng.randbytes(40))
    script = tmp_path / "ranks.py"
    script.write_text(SPAWNED)
    run = run_python([str(script), str(root), str(tmp_path)], timeout=280)  # (this tree's microco)
    assert run.returncode == 0, run.stderr[-3000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [g["ranks"] for g in got] == [[2, 0, "j/rank0"], [2, 1, "j/rank1"]]
    for e in range(2):  # the sampler alone: exactly once, equal steps
        steps = [g["pure"][e] for g in got]
        assert len(steps[0]) == len(steps[1]) and all(steps[0] + steps[1])
        assert sorted(i for s in steps for b in s for i in b) == list(range(N)), e
    whole = [g["loader"][0] for g in got]  # the loader, epoch 0
    assert len(whole[0]) == len(whole[1]) == -(-N // (2 * BATCH))
    assert sorted(i for s in whole for b in s for i in b) == list(range(N))
    # Epoch 1 suspended after 2 steps; rank 0's position is the job's: one rank finishes it.
    first = [i for g in got for b in g["loader"][1] for i in b]
    assert len(first) == 2 * 2 * BATCH and len(set(first)) == len(first)
    store = LocalStore(str(root))
    idx = build_index(store.list_files(), store.read, 200)
    one = QuiverLoader(idx, store, batch_size=BATCH, dataset="d", job_id="j", server=False, world_size=1)
    one.load_state_dict(got[0]["state"])
    assert one.resume_epoch == 1
    rest = [i for b, _ in one.epoch(1) for i in b]
    one.close()
    assert sorted(first + rest) == list(range(N))
