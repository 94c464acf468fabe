"""The background worker compiles the configuration it was given, however many steps the probe
takes first (issue 18, session 43): it ran two steps, the probe's and one to compile, while the
probe had come to take two of its own where a whole-step compile could pay (its first step, then
one counted and profiled). On a Hugging Face T5 (12 ms a step) the worker compiled nothing, said
it was done in 0.9 s, and the trial's compile in the training process was a cold one, abandoned
at its deadline after 10 s, twice in one run (1.7x eager's wall time over 5,000 steps)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

torch = pytest.importorskip("torch")
from _support import through_probe
from torch import nn

from microco.clients.compiler import _background_worker
from microco.clients.compiler._torch import AstraTorch

pytestmark = pytest.mark.torch

COUNTING = "microco-test-counting"
CALLS: list[int] = []


def _counting(gm, example_inputs):
    CALLS.append(len(gm.graph.nodes))
    return gm.forward


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture
def counting_backend(monkeypatch):
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if COUNTING not in _BACKENDS:
        register_backend(compiler_fn=_counting, name=COUNTING)
    monkeypatch.setattr(AstraTorch, "WHOLE_COMPILE_BACKEND", COUNTING)
    CALLS.clear()
    torch._dynamo.reset()
    yield CALLS
    torch._dynamo.reset()


def _payload(model: nn.Module) -> dict:
    torch.manual_seed(0)
    return {
        "model": model,
        "args": (torch.randn(4, 8),),
        "kwargs": {},
        "values": {"model.compile": "inductor"},
        "threads": torch.get_num_threads(),
        "compile_choices": ["eager", "inductor"],
    }


@pytest.mark.parametrize("probe_steps", [1, 2], ids=["probe-alone", "probe-counts-a-step"])
def test_the_worker_compiles_the_configuration_whatever_the_probe_takes(
    counting_backend, monkeypatch, tmp_path, probe_steps
):
    monkeypatch.setenv("MICROCO_COMPILER_HOME", str(tmp_path / "home"))
    # Whether the probe counts and profiles a second step depends on the step's time against
    # what a compile could save (a 12 ms T5 step did, a tiny model's does not): both are made so.
    monkeypatch.setattr(AstraTorch, "_whole_could_pay", lambda self, step_ms: probe_steps == 2)
    seen: list[int] = []
    real_probe = AstraTorch._wants_deep_probe

    def probe_again(self, step_ms):
        out = real_probe(self, step_ms)
        seen.append(int(out))
        return out

    monkeypatch.setattr(AstraTorch, "_wants_deep_probe", probe_again)
    _background_worker.compile_in_background(_payload(Mlp()))
    assert seen == [probe_steps == 2], seen  # the probe took the steps it was made to
    assert counting_backend, "the worker compiled nothing"


def test_a_configuration_never_compiled_is_an_error_not_a_done_compile(
    counting_backend, monkeypatch, tmp_path
):
    monkeypatch.setenv("MICROCO_COMPILER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(AstraTorch, "_needs_compile", lambda self, values: True)
    with pytest.raises(RuntimeError, match="not compiled in"):
        _background_worker.compile_in_background(_payload(Mlp()))


# -- what the worker differentiates (held out, session 43)
AOT_COUNTING = "microco-test-aot-counting"
BACKWARDS: list[int] = []


def _aot_counting():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def forward(gm, example_inputs):
        return make_boxed_func(gm.forward)

    def backward(gm, example_inputs):
        BACKWARDS.append(len(gm.graph.nodes))  # AOTAutograd compiles it at the first backward
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=forward, bw_compiler=backward)


@dataclasses.dataclass
class Outputs:
    logits: torch.Tensor
    aux: torch.Tensor


class Holder:
    def __init__(self, logits: torch.Tensor, extra: dict[str, torch.Tensor]) -> None:
        self.logits, self.extra = logits, extra


class Heads(nn.Module):
    """The same forward returning its outputs as a dict, a plain dataclass, or another object."""

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = shape
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        logits, aux = self.b(h), self.c(h)
        if self.shape == "dict":
            return {"logits": logits, "aux": aux}
        if self.shape == "dataclass":
            return Outputs(logits, aux)
        return Holder(logits, {"aux": aux})


@pytest.mark.parametrize("shape", ["dict", "dataclass", "object"])
def test_the_worker_compiles_the_backward_of_a_forward_whatever_it_returns(monkeypatch, tmp_path, shape):
    """A model returning a plain dataclass (not a pytree): the worker's loss found no tensor, ran
    no backward, and reported its compile done; the training process's backward then compiled
    cold (held out, session 43: Inductor's FX cache missed the backward, AOTAutograd's the step)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if AOT_COUNTING not in _BACKENDS:
        register_backend(compiler_fn=_aot_counting(), name=AOT_COUNTING)
    monkeypatch.setattr(AstraTorch, "WHOLE_COMPILE_BACKEND", AOT_COUNTING)
    monkeypatch.setenv("MICROCO_COMPILER_HOME", str(tmp_path / "home"))
    BACKWARDS.clear()
    torch._dynamo.reset()
    try:
        _background_worker.compile_in_background(_payload(Heads(shape)))
    finally:
        torch._dynamo.reset()
    assert BACKWARDS, f"the worker compiled no backward of a forward returning a {shape}"


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(32, 8), nn.Linear(8, 32)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


@pytest.mark.parametrize("feed", ["an-activation-requiring-grad", "a-sliced-batch"])
def test_the_worker_is_handed_the_inputs_the_training_process_compiles_for(counting_backend, feed):
    """What the worker compiles (and the probe asks Inductor's caches about) is the forward on
    copies of the probe step's inputs. Held out, session 43: the copies were ``detach().clone()``,
    which drops whether an input requires grad (a model fed an embedding's output) and a slice's
    strides (a language model fed ``tokens[:, :-1]``): another graph than the one the training
    process compiles, whose compile then missed the worker's cache. Here: the forward compiled on
    the payload's inputs is not compiled again for the training step's own inputs."""
    torch.manual_seed(0)
    if feed == "a-sliced-batch":
        model, tokens = TokenModel(), torch.randint(0, 32, (4, 9))

        def inputs():
            return (tokens[:, :-1],)  # (the targets: tokens[:, 1:])
    else:
        model, emb = Mlp(), nn.Embedding(16, 8)
        ids = torch.randint(0, 16, (4,))

        def inputs():
            return (emb(ids),)

    astra = AstraTorch(model, name="inputs", compile_choices=("eager", "inductor"), background=True)
    through_probe(astra, lambda: _loss_of(model(*inputs())))
    payload = astra._background_payload({"model.compile": "inductor"})
    astra.restore()
    assert payload is not None
    compiled = torch.compile(model.forward, backend=COUNTING, dynamic=False)
    compiled(*payload["args"], **payload["kwargs"])  # the worker's graph
    assert len(counting_backend) == 1
    compiled(*inputs())  # the training step's
    assert len(counting_backend) == 1, "the training step's inputs make another graph than the worker's"


def _loss_of(out):
    loss = out.float().pow(2).mean()
    loss.backward()
    return loss


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, h):
        return self.b(torch.tanh(self.a(h))).mean(1)


def _siamese(model):
    query, document = torch.randn(4, 3, 8), torch.randn(4, 5, 8)  # two lengths: two graphs
    return [lambda: model(query), lambda: model(document)]


def _autocast(model):
    x = torch.randn(4, 3, 8)

    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)

    return [call]


@pytest.mark.parametrize("step_calls", [_siamese, _autocast], ids=["siamese-pair", "under-autocast"])
def test_the_worker_compiles_every_graph_of_the_training_step(
    counting_backend, monkeypatch, tmp_path, step_calls
):
    """Held out, session 43: the worker ran the model once, on the probe step's last call's
    inputs and without the step's autocast. A step calling the model on a query and on a longer
    document compiled the query's graph cold in the training process; a step under autocast,
    every graph (dynamo guards on the autocast state). Here: the worker compiles as many graphs
    as the step runs, and the step's calls compile nothing the worker's calls did not."""
    monkeypatch.setenv("MICROCO_COMPILER_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    model = Encoder()
    calls = step_calls(model)

    def step():
        loss = sum(call().float().pow(2).mean() for call in calls)
        loss.backward()
        return loss

    astra = AstraTorch(model, name="calls", compile_choices=("eager", "inductor"), background=True)
    through_probe(astra, step)
    payload = astra._background_payload({"model.compile": "inductor"})
    astra.restore()
    assert payload is not None
    _background_worker.compile_in_background(payload)
    worker_graphs = len(counting_backend)
    torch._dynamo.reset()
    counting_backend.clear()
    compiled = torch.compile(model.forward, backend=COUNTING, dynamic=False)
    model.forward = compiled
    try:
        step()  # the training process's graphs, compiled anew here
    finally:
        del model.forward
    step_graphs = len(counting_backend)
    assert worker_graphs == step_graphs > 0, (worker_graphs, step_graphs)
    # ... and the same ones: the worker's calls, made again, compile nothing more
    for call in payload.get("calls") or [{"args": payload["args"], "kwargs": payload["kwargs"]}]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(call.get("grad", True)))
            for device, dtype in call.get("autocast", ()):
                stack.enter_context(torch.autocast(device, dtype=getattr(torch, dtype)))
            compiled(*call["args"], **call["kwargs"])
    assert len(counting_backend) == step_graphs, "the worker compiled graphs the step does not run"


def test_the_models_copy_for_the_worker_is_let_go_once_no_compile_is_wanted(monkeypatch, tmp_path):
    """Held out, session 43: the model's copy the worker is rebuilt from was kept for the
    wrapper's life, through a run that had committed and called the user's code directly (a
    second copy of the parameters, on a GPU host in the device's memory)."""
    import gc
    import weakref

    monkeypatch.setenv("MICROCO_COMPILER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MICROCO_COMPILE_COSTS", str(tmp_path / "costs.json"))
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    # (nothing to compile: the exploration commits the model's own code)
    astra = AstraTorch(model, name="copy", total_steps=300, compile_choices=("eager",), background=True)
    astra.run(step)
    assert astra._snapshot is not None  # taken for the background compiles
    copy = weakref.ref(astra._snapshot)
    for _ in range(299):
        astra.run(step)
    assert astra.direct, "the run did not commit the model's own code"
    gc.collect()
    assert copy() is None, "the model's copy outlived every background compile"
