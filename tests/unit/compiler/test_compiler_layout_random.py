"""Random numbers drawn over feature maps follow the tensor's storage order, so a channels-last
trial draws other numbers than the eager run at the same generator state.

Held out (issue 18): diffusers' ``UNet2DModel`` (session 35), whose ResNet blocks apply
``nn.Dropout`` to feature maps, moved 0.7% from the eager run's loss from its first channels-last
trial on; torchvision's DenseNet-121 with ``drop_rate`` (session 36), whose dense layers call
``F.dropout`` inside ``forward`` (no module to hook), committed channels-last and its losses left
the eager run's by up to 3.36x. The probe step's ``LayoutDrawWatch`` redraws each random call
over channels-last copies at the same generator state and asks PyTorch whether the numbers
differ: a model whose draws follow the layout is not offered channels-last and its losses are the
eager run's; one that draws one number per channel or per sample (``F.dropout2d``, a drop-path
mask) or over a ``[B, C]`` vector (a classifier's dropout, as torchvision's MobileNetV3 has)
keeps the variable."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from microco.clients.compiler import AstraTorch
from microco.clients.compiler._rng import LayoutDrawWatch, layout_dependent_draw
from microco.clients.compiler.explore import LocalExplorer


def _drop_path(h: torch.Tensor, p: float) -> torch.Tensor:
    keep = h.new_empty((h.shape[0], 1, 1, 1)).bernoulli_(1 - p)  # (timm's, torchvision's shape)
    return h * keep / (1 - p)


# what the forward does to its first feature map (or, "...-over-a-vector", to the pooled vector)
# -> does the draw follow the layout?
_DRAWS = {
    "dropout-module": (lambda m, h: m.drop(h), True),  # (what the modules' hooks saw before)
    "functional-dropout": (lambda m, h: F.dropout(h, 0.3, m.training), True),
    "rand-like-mask": (lambda m, h: h * (torch.rand_like(h) > 0.3) if m.training else h, True),
    "alpha-dropout": (lambda m, h: F.alpha_dropout(h, 0.2, m.training), True),
    "dropout2d": (lambda m, h: F.dropout2d(h, 0.3, m.training), False),
    "drop-path": (lambda m, h: _drop_path(h, 0.3) if m.training else h, False),
    "dropout-module-over-a-vector": (lambda m, h: m.drop(h), False),
}


class _Net(nn.Module):
    def __init__(self, draw: str) -> None:
        super().__init__()
        self.draw, self.vector = _DRAWS[draw][0], draw.endswith("-over-a-vector")
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.drop, self.head = nn.Dropout(0.3), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if not self.vector:
            h = self.draw(self, h)
        h = torch.relu(self.b(h)).mean((2, 3))
        if self.vector:
            h = self.draw(self, h)
        return self.head(h)


def _astra(model, state):
    """AstraTorch over ``model``, eager code only, its exploration kept in ``state``."""
    return AstraTorch(
        model,
        LocalExplorer.on_disk(str(state)),
        threads=("1",),
        compile_choices=("eager",),
        background=False,
        total_steps=5000,  # (told a long run: a short one would not try channels-last at all)
    )


def _train(draw: str, tmp_path, astra: bool, steps: int = 14, compiled: bool = False):
    torch.manual_seed(0)
    model = _Net(draw)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # the user's own torch.compile (dynamo's graph run eagerly: the draws are eager's)
    called = torch.compile(model, backend="eager") if compiled else model
    wrapped = _astra(called, tmp_path / f"explore-{draw}.json") if astra else None
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(3)
    ]
    torch.manual_seed(2)  # the draws' stream

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(called(x), y)
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


@pytest.mark.parametrize("draw", list(_DRAWS))
def test_a_draw_that_follows_the_layout_keeps_channels_last_off_and_the_losses_eager(tmp_path, draw):
    follows = _DRAWS[draw][1]
    eager, _ = _train(draw, tmp_path, astra=False)
    astra, offered = _train(draw, tmp_path, astra=True)
    assert ("memory_format" in offered) is not follows
    # the same numbers drawn: the losses differ by float order at most (channels-last convolutions)
    assert astra == pytest.approx(eager, rel=1e-4)


@pytest.mark.parametrize("draw", ["functional-dropout", "drop-path"])
def test_in_a_users_compiled_model_any_draw_keeps_channels_last_off(tmp_path, draw):
    """A model holding the user's ``torch.compile`` is not watched call by call (dynamo guards on
    the mode stack): there any draw in the probe step keeps channels-last off, a drop-path's
    too (conservative: its draws are not redrawn), and the losses are the compiled run's."""
    eager, _ = _train(draw, tmp_path, astra=False, compiled=True)
    astra, offered = _train(draw, tmp_path, astra=True, compiled=True)
    assert "memory_format" not in offered
    assert astra == pytest.approx(eager, rel=1e-4)


def test_a_watch_that_cannot_redraw_counts_any_advance_of_the_generator():
    quiet = LayoutDrawWatch(redraw=False)
    quiet.start()
    torch.relu(torch.ones(2, 8, 4, 4))
    quiet.stop()
    assert not quiet.found
    drawing = LayoutDrawWatch(redraw=False)
    drawing.start()
    torch.rand(3)
    drawing.stop()
    assert drawing.found == LayoutDrawWatch.COMPILED


def test_the_watch_leaves_the_steps_own_numbers_and_the_generator_as_it_found_them():
    x = torch.randn(2, 8, 5, 5)

    def draws():
        torch.manual_seed(3)
        a = F.dropout(x, 0.5, True)
        b = torch.rand_like(x)
        c = torch.empty(2, 8, 5, 5).bernoulli_(0.5)
        return a, b, c, torch.rand(4)  # the last: where the generator was left

    plain = draws()
    watch = LayoutDrawWatch()
    watch.start()
    try:
        watched = draws()
    finally:
        watch.stop()
    assert watch.found  # the first of them follows the layout
    for p, w in zip(plain, watched, strict=True):
        assert torch.equal(p, w)


def test_the_watch_asks_pytorch_not_a_list_of_names():
    """Which calls follow the layout is PyTorch's answer at the same generator state: one draw
    per channel (``dropout2d``), per probability given (``torch.bernoulli``) or over an explicit
    shape (``torch.rand``) draws the same numbers in either layout."""
    x = torch.randn(2, 8, 5, 5)
    for fn, follows in [
        (lambda: F.dropout(x, 0.5, True), True),
        (lambda: F.dropout(x, 0.5, False), False),  # not training: nothing drawn
        (lambda: F.dropout2d(x, 0.5, True), False),
        (lambda: F.feature_alpha_dropout(x, 0.5, True), False),
        (lambda: torch.bernoulli(torch.sigmoid(x)), False),
        (lambda: torch.rand(x.shape), False),
        (lambda: F.dropout(x[:, :1], 0.5, True), False),  # one channel: one order
        (lambda: F.dropout(x.flatten(1), 0.5, True), False),  # a vector per sample
    ]:
        watch = LayoutDrawWatch()
        watch.start()
        try:
            fn()
        finally:
            watch.stop()
        assert bool(watch.found) is follows, fn


def test_which_calls_draw_a_mask_that_follows_the_layout():
    drop = nn.Dropout(0.2)
    assert layout_dependent_draw(drop, (torch.zeros(2, 8, 4, 4),))
    assert not layout_dependent_draw(drop, (torch.zeros(2, 8),))  # a classifier's input
    assert not layout_dependent_draw(drop, (torch.zeros(2, 1, 1, 1),))  # a drop-path mask
    assert not layout_dependent_draw(nn.Dropout(0.0), (torch.zeros(2, 8, 4, 4),))
    assert layout_dependent_draw(nn.Dropout2d(0.1), (torch.zeros(2, 8, 4, 4),))
    assert not layout_dependent_draw(nn.Dropout(0.2).eval(), (torch.zeros(2, 8, 4, 4),))
    assert not layout_dependent_draw(nn.ReLU(), (torch.zeros(2, 8, 4, 4),))


class _Hybrid(nn.Module):
    """Convolutions around a small self-attention block over the map's positions (MobileViT's
    shape): its attention probabilities ``[B, heads, N, N]`` come out of a matrix product, laid
    out contiguously whatever the convolutions' layout. ``tokens``: a dropout over the tokens
    themselves, ``h.flatten(2).transpose(1, 2)``, a transposed view in the eager step but
    contiguous under channels-last (the same numbers, drawn in memory order, fall elsewhere)."""

    def __init__(self, tokens: bool = False) -> None:
        super().__init__()
        self.tokens, self.heads = tokens, 2
        self.attn_p = 0.0 if tokens else 0.3  # (the tokens' draw alone)
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.qkv, self.out, self.head = nn.Linear(8, 24), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        b, c, hh, ww = h.shape
        t = h.flatten(2).transpose(1, 2)  # [B, N, C]
        if self.tokens:
            t = F.dropout(t, 0.2, self.training)
        q, k, v = self.qkv(t).reshape(b, -1, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5).softmax(-1)
        att = F.dropout(att, self.attn_p, self.training)  # [B, heads, N, N]
        t = self.out((att @ v).transpose(1, 2).reshape(b, -1, c))
        h = h + t.transpose(1, 2).reshape(b, c, hh, ww)
        return self.head(torch.relu(self.b(h)).mean((2, 3)))


def _train_hybrid(tmp_path, astra: bool, tokens: bool = False, steps: int = 16, cl: bool = False):
    torch.manual_seed(0)
    model = _Hybrid(tokens)
    if cl:  # (plain channels-last, no compiler: what a channels-last commit trains as)
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    wrapped = _astra(model, tmp_path / f"explore-hybrid-{tokens}.json") if astra else None
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(3)]
    torch.manual_seed(2)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    losses, formats = [], []
    for i in range(steps):
        x, y = data[i % len(data)]
        losses.append(float(wrapped.run(step, x, y) if wrapped else step(x, y)))
        formats.append(wrapped.running.get("memory_format") if wrapped else None)
    offered = [v.name for v in wrapped.session.spec.variables] if wrapped else []
    if wrapped:
        wrapped.restore()
    return losses, offered, formats


def test_attention_dropout_beside_convolutions_keeps_channels_last_and_the_losses_eager(tmp_path):
    """Issue 18, session 37: the probe's guess (a draw over any four-dimensional tensor that a
    channels-last copy would change) counted the attention probabilities' dropout, and a hybrid
    model (Hugging Face's or timm's MobileViT with attention dropout) lost channels-last. The
    channels-last forward's own draws are the eager step's: offered, run, and the losses are the
    eager run's (float order of the channels-last convolutions apart)."""
    eager, _, _ = _train_hybrid(tmp_path, astra=False)
    astra, offered, formats = _train_hybrid(tmp_path, astra=True)
    assert "memory_format" in offered
    assert "channels_last" in formats  # (tried: the exploration ran steps under it)
    assert astra == pytest.approx(eager, rel=1e-4)


def test_a_dropout_over_tokens_flattened_from_a_map_keeps_channels_last_off(tmp_path):
    """Not four-dimensional, and still following the layout: tokens flattened from a
    channels-last map are laid out otherwise than the eager step's (the probe's guess looked at
    four-dimensional tensors only, and offered channels-last)."""
    eager, _, _ = _train_hybrid(tmp_path, astra=False, tokens=True)
    astra, offered, _ = _train_hybrid(tmp_path, astra=True, tokens=True)
    assert eager != pytest.approx(_train_hybrid(tmp_path, astra=False, tokens=True, cl=True)[0], rel=1e-4)
    assert "memory_format" not in offered
    assert astra == pytest.approx(eager, rel=1e-4)


def test_the_channels_last_check_leaves_the_model_and_the_generator_as_it_found_them():
    from microco.clients.compiler._rng import layout_forward_check

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Dropout(0.5))
    x = torch.randn(2, 3, 6, 6)
    watch = LayoutDrawWatch()
    watch.start()
    try:
        model(x)
    finally:
        watch.stop()
    assert watch.found and watch.seen  # (a dropout over the maps: the guess and the check agree)
    kept = {n: t.clone() for n, t in model.state_dict().items()}
    state = torch.get_rng_state()
    assert layout_forward_check(model, (x,), {}, watch) == "dropout"  # (its draw over channels-last maps)
    assert torch.equal(torch.get_rng_state(), state)
    for n, t in model.state_dict().items():
        assert torch.equal(t, kept[n]) and t.stride() == kept[n].stride(), n
