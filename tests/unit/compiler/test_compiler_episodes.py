"""Issue 18, held out (session 40): episodic training, in the shape of pytorch/examples'
``reinforcement_learning/reinforce.py`` and ``actor_critic.py``.

The policy keeps what an episode needs on itself: ``select_action`` samples an action from a
``Categorical`` over the policy's output and appends its log-probability to
``policy.saved_log_probs`` (a list on the module), the loop appends each reward to
``policy.rewards``, and ``finish_episode`` builds the loss from both, steps the optimiser and
clears the lists. Wrapped whole (an episode is one ``AstraTorch.run``), a trial failing in the
optimiser's step was rolled back without the lists: the repeat appended a second episode's
entries after the failed attempt's, whose graphs that attempt's backward had freed, and raised
"Trying to backward through the graph a second time" under every configuration, the last
good one too: the run stopped. The step guard now keeps the modules' own Python state (their
lists and dicts, their plain attributes: a counter of steps taken) at the step's start and a
rollback puts it back."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from _support import fails_once_under_a_trial
from torch import nn
from torch.distributions import Categorical
from torch.nn import functional as F

from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]  # (conftest)

EPISODES = 14


class _Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 16)
        self.affine2 = nn.Linear(16, 2)
        self.saved_log_probs: list[torch.Tensor] = []
        self.rewards: list[float] = []
        self.steps_done = 0  # (an exploration schedule reads it: DQN's epsilon)

    def forward(self, x):
        return F.softmax(self.affine2(F.relu(self.affine1(x))), dim=1)


_FailsOnceUnderATrial = fails_once_under_a_trial(torch.optim.Adam)


def _state(i: int, t: int, action: int) -> torch.Tensor:
    """A deterministic environment: the next state from the episode, the time and the action."""
    g = torch.Generator().manual_seed(1000 * i + 2 * t + action)
    return torch.randn(1, 4, generator=g)


def _train(astra_on: bool) -> tuple[list[float], dict[str, torch.Tensor], int]:
    torch.manual_seed(543)
    policy = _Policy()
    opt_cls = _FailsOnceUnderATrial
    opt_cls.failed = 0
    optimizer = opt_cls(policy.parameters(), lr=1e-2)
    astra = None
    if astra_on:
        astra = AstraTorch(
            policy,
            LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
            total_steps=1_000_000,  # every candidate is worth its trial
            threads=("1",),
            compile_choices=("eager",),
            background=False,
        )
    opt_cls.astra = astra

    def select_action(state):
        probs = policy(state)
        m = Categorical(probs)
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        policy.steps_done += 1
        return int(action.item())

    def finish_episode():
        R, returns = 0.0, []
        for r in policy.rewards[::-1]:
            R = r + 0.99 * R
            returns.insert(0, R)
        ret = torch.tensor(returns)
        ret = (ret - ret.mean()) / (ret.std() + 1e-6)
        loss = torch.cat([-lp * r for lp, r in zip(policy.saved_log_probs, ret)]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        del policy.rewards[:]
        del policy.saved_log_probs[:]
        return float(loss.item())

    def episode(i):
        state = _state(i, 0, 0)
        for t in range(1, 9):
            action = select_action(state)
            state = _state(i, t, action)
            policy.rewards.append(1.0 + 0.5 * math.sin(float(state[0, 0])))
        return finish_episode()

    try:
        losses = [astra.run(episode, i) if astra is not None else episode(i) for i in range(EPISODES)]
    finally:
        opt_cls.astra = None
    rolled_back = astra.rolled_back if astra is not None else 0
    if astra is not None:
        astra.restore()
    assert policy.steps_done == 8 * EPISODES  # (not the failed attempt's steps on top)
    return losses, {k: v.detach().clone() for k, v in policy.state_dict().items()}, rolled_back


def test_an_episode_whose_policy_keeps_its_log_probs_is_rolled_back_with_them_and_repeated():
    eager, eager_state, _ = _train(False)
    astra, astra_state, rolled_back = _train(True)  # raised "backward through the graph a second time"
    assert rolled_back == 1
    assert astra == pytest.approx(eager, rel=1e-5, abs=1e-6)
    for k, v in eager_state.items():
        assert torch.allclose(astra_state[k], v, atol=1e-6), k
