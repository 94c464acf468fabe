"""A dropout over feature maps draws its mask in the tensor's storage order, so a channels-last
trial drops other elements than the eager run at the same generator state (held out, issue 18,
session 35: diffusers' ``UNet2DModel``, whose ResNet blocks apply ``nn.Dropout`` to feature maps,
moved 0.7% from the eager run's loss from its first channels-last trial on). Such a model is not
offered channels-last, and its losses are the eager run's; a dropout over a ``[B, C]`` input
(a classifier's, as torchvision's MobileNetV3 has) draws the same mask in either layout, and the
variable stays."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from microco.clients.compiler import AstraTorch
from microco.clients.compiler._rng import layout_dependent_draw
from microco.clients.compiler.explore import LocalExplorer


class _Net(nn.Module):
    def __init__(self, maps: bool) -> None:
        super().__init__()
        self.maps = maps
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.drop, self.head = nn.Dropout(0.3), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.maps:
            h = self.drop(h)  # over [B, C, H, W]: the mask follows the layout
        h = torch.relu(self.b(h)).mean((2, 3))
        if not self.maps:
            h = self.drop(h)  # over [B, C]: one order in either layout
        return self.head(h)


def _train(maps: bool, tmp_path, astra: bool, steps: int = 14):
    torch.manual_seed(0)
    model = _Net(maps)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    wrapped = (
        AstraTorch(
            model,
            LocalExplorer.on_disk(str(tmp_path / f"explore-{maps}.json")),
            threads=("1",),
            compile_choices=("eager",),
            background=False,
            total_steps=5000,  # (told a long run: a short one would not try channels-last at all)
        )
        if astra
        else None
    )
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(3)
    ]
    torch.manual_seed(2)  # the dropout's stream

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    losses = []
    for i in range(steps):
        x, y = data[i % len(data)]
        losses.append(float(wrapped.run(step, x, y) if wrapped else step(x, y)))
    offered = [v.name for v in wrapped.session.spec.variables] if wrapped else []
    if wrapped:
        wrapped.restore()
    return losses, offered


@pytest.mark.parametrize("maps", [True, False], ids=["dropout-over-feature-maps", "dropout-over-a-vector"])
def test_channels_last_is_offered_only_where_the_masks_stay_the_eager_runs(tmp_path, maps):
    eager, _ = _train(maps, tmp_path, astra=False)
    astra, offered = _train(maps, tmp_path, astra=True)
    assert ("memory_format" in offered) is not maps
    # the same masks: the losses differ by float order at most (channels-last convolutions)
    assert astra == pytest.approx(eager, rel=1e-4)


def test_which_calls_draw_a_mask_that_follows_the_layout():
    drop = nn.Dropout(0.2)
    assert layout_dependent_draw(drop, (torch.zeros(2, 8, 4, 4),))
    assert not layout_dependent_draw(drop, (torch.zeros(2, 8),))  # a classifier's input
    assert not layout_dependent_draw(drop, (torch.zeros(2, 1, 1, 1),))  # a drop-path mask
    assert not layout_dependent_draw(nn.Dropout(0.0), (torch.zeros(2, 8, 4, 4),))
    assert layout_dependent_draw(nn.Dropout2d(0.1), (torch.zeros(2, 8, 4, 4),))
    assert not layout_dependent_draw(nn.Dropout(0.2).eval(), (torch.zeros(2, 8, 4, 4),))
    assert not layout_dependent_draw(nn.ReLU(), (torch.zeros(2, 8, 4, 4),))
