"""The sampler positions a DDP job's checkpoint holds: every rank's (not rank 0's alone), so a
job resumed with the same ranks continues each rank's own epoch, and one grown or shrunk in
between loads a job-wide position merged by the sampler (Quiver's loader: ``merge_positions``).
Issue 20 ("resumable ... after a change in the number of ranks"); no process group needed."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from microco.clients.scheduler import TorchHook


class Positions:
    """A sampler that keeps what it was given."""

    def __init__(self, merge: bool) -> None:
        self.loaded = None
        if merge:
            self.merge_state_dicts = lambda states: {"merged": [s["rank"] for s in states]}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        self.loaded = state


def hook(tmp_path, group, merge=False) -> TorchHook:
    import torch

    h = TorchHook(torch.nn.Linear(1, 1), sampler=Positions(merge), control_dir=str(tmp_path))
    h._group = group
    return h


SAVED = [{"rank": 0}, {"rank": 1}]


def test_each_rank_of_a_job_of_the_same_size_loads_its_own_position(tmp_path):
    assert hook(tmp_path, (1, 2))._sampler_position(SAVED) == {"rank": 1}
    assert hook(tmp_path, (0, 2))._sampler_position(SAVED) == {"rank": 0}


def test_a_job_of_another_size_loads_the_merged_position(tmp_path):
    assert hook(tmp_path, None, merge=True)._sampler_position(SAVED) == {"merged": [0, 1]}
    assert hook(tmp_path, (2, 3), merge=True)._sampler_position(SAVED) == {"merged": [0, 1]}


def test_a_sampler_that_cannot_merge_is_refused_at_another_size_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="positions of 2 ranks and this job has 1.*same number of ranks"):
        hook(tmp_path, None)._sampler_position(SAVED)


def test_a_position_saved_without_a_process_group_loads_as_it_is(tmp_path):
    assert hook(tmp_path, (0, 2))._sampler_position({"rank": 0, "world_size": 1}) == {
        "rank": 0,
        "world_size": 1,
    }


def test_quivers_loader_merges_every_ranks_position_for_the_hook():
    from microco.clients.cache import QuiverLoader, merge_positions

    assert QuiverLoader.merge_state_dicts is merge_positions
