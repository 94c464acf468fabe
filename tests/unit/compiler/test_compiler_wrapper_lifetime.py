"""Issue 18, held out (session 39): a wrapper dropped before its exploration settles leaves
nothing of itself in the user's process.

A sweep (a search over hyper-parameters, each trial a new model and a new ``AstraTorch``, each
stopped early) ends runs before they commit, and never calls ``restore()``. Each wrapper left
two things registered process-wide: its background compiler's ``atexit`` entry, which kept the
wrapper and its model alive until the process ended, and a global optimiser pre-step hook (the
one that finds optimisers first stepped after the probe step), run at every optimiser step of
every later model."""

from __future__ import annotations

import gc
import weakref

import pytest
from _support import seeded_steps

torch = pytest.importorskip("torch")
from torch import nn
from torch.optim import optimizer as _optimizer

from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]  # (conftest)


def _trial(seed: int):
    """A few steps of a conv net (channels-last is offered) through a new wrapper, stopped
    before the exploration commits; what is left of it: weak references."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    astra = AstraTorch(
        model,
        LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
        total_steps=1_000_000,
        threads=("1", "2"),
        compile_choices=("eager",),  # (a background compiler all the same: ``background`` left out)
    )
    seeded_steps(model, opt, astra.run, 4, (2, 3, 6, 6))
    assert not astra.session.settled and astra.background is not None
    return weakref.ref(model), weakref.ref(astra)


def test_a_wrapper_dropped_before_it_settles_leaves_no_hook_and_lets_its_model_go():
    hooks = len(_optimizer._global_optimizer_pre_hooks)
    refs = [_trial(seed) for seed in range(2)]
    gc.collect()
    assert len(_optimizer._global_optimizer_pre_hooks) == hooks
    assert all(model() is None and astra() is None for model, astra in refs)
