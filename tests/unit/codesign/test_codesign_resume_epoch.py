"""State that follows a job: a job restarted from its checkpoint (after a migration, say)
continues its epoch where the loader left it, with exactly the samples it had not been given,
whatever the new host's cache holds. No servers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from microco.clients.cache import QuiverLoader
from microco.clients.scheduler import TorchHook
from microco.services.cache import LocalStore, build_index

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _cache_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MICROCO_HOME", str(tmp_path_factory.mktemp("microco-home")))


def _loader(root, read_ahead):
    root.mkdir(exist_ok=True)
    for i in range(40):
        (root / f"f{i:03d}").write_bytes(bytes([i]) * 150)
    store = LocalStore(str(root))
    idx = build_index(store.list_files(), store.read, 600)
    return QuiverLoader(
        idx,
        store,
        batch_size=4,
        dataset="d",
        job_id="j",
        server=None,
        prefetch_batches=2 if read_ahead else 0,
    )


@pytest.mark.parametrize("read_ahead", [True, False])
def test_a_restarted_job_continues_its_epoch_with_the_samples_it_had_not_seen(tmp_path, read_ahead):
    ckpt = tmp_path / "ckpt"
    model = torch.nn.Linear(2, 1)
    loader = _loader(tmp_path / "data", read_ahead)
    hook = TorchHook(model, sampler=loader, checkpoint_dir=str(ckpt))
    assert hook.restore() == 0
    first: list[int] = []
    for step, (indices, _data) in enumerate(loader.epoch(0), 1):
        first += indices
        hook.step_end(step)
        if step == 3:
            hook.checkpoint()  # then the job is stopped (and started again elsewhere)
            break
    loader.close()

    model2 = torch.nn.Linear(2, 1)
    loader2 = _loader(tmp_path / "data", read_ahead)
    hook2 = TorchHook(model2, sampler=loader2, checkpoint_dir=str(ckpt))
    assert hook2.restore() == 3 and loader2.resume_epoch == 0
    rest = [i for indices, _ in loader2.epoch(loader2.resume_epoch) for i in indices]
    assert sorted(first + rest) == list(range(40))  # every sample once: none lost, none twice
    # The epoch done, the position says so: a restart now begins the next epoch.
    state = loader2.state_dict()
    loader3 = _loader(tmp_path / "data", read_ahead)
    loader3.load_state_dict(state)
    assert loader3.resume_epoch == 1
    loader2.close()
    loader3.close()


def test_a_position_of_another_dataset_is_refused(tmp_path):
    loader = _loader(tmp_path / "data", False)
    with pytest.raises(ValueError, match="for 7 samples; this dataset has 40"):
        loader.load_state_dict({"epoch": 0, "seen": [], "num_samples": 7, "rank": 0, "world_size": 1})
    loader.close()
