"""Issue 18: the identical second run of a script gets the first run's graph key: the
fingerprint holds no object ids, addresses, random names or anything the run measured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _support import through_probe

from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.zoo import torch_models as zm

pytestmark = pytest.mark.torch

SCRIPT = """
import sys, torch
from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.zoo import torch_models as zm
class Null:
    def register(self, spec):
        from microco.clients.compiler import baseline
        return baseline(spec)
    def report(self, key, rep):
        return None
torch.manual_seed(int(sys.argv[1]))  # other weights, same model
model = zm.make_model("milstm", 4, 8)
astra = AstraTorch(
    model, Null(), compile_choices=("eager",), threads=("1",), total_steps=2, background=False
)
x, y = zm.synthetic_batch(3, 2, 4)
with astra.step():
    zm.loss_fn(model(x), y).backward()
print("KEY", astra.spec().key)
"""


def _key_in_a_new_process(seed: int) -> str:
    root = Path(__file__).resolve().parents[3]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root / "protos"), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(seed)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    ).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("KEY "))


def test_two_processes_get_the_same_key():
    # This process and a new one (one interpreter start, not two: each imports torch anew, ~50 s
    # of a loaded CI machine); the thread choices are fixed, the rest as the script has it.
    torch.manual_seed(2)  # other weights, same model
    model = zm.make_model("milstm", 4, 8)
    astra = AstraTorch(
        model, _Null(), compile_choices=("eager",), threads=("1",), total_steps=2, background=False
    )
    x, y = zm.synthetic_batch(3, 2, 4)
    with astra.step():
        zm.loss_fn(model(x), y).backward()
    here = astra.spec().key
    astra.restore()
    assert _key_in_a_new_process(1) == here


class _Null:
    def register(self, spec):
        from microco.clients.compiler import baseline

        return baseline(spec)

    def report(self, key, rep):
        return None


def test_the_key_does_not_follow_what_the_probe_step_measured(monkeypatch):
    """A long run asks dynamo's graph (and Inductor's cache) which whole-step compiles to offer;
    a short run does not. Both are the same model on the same machine: one key."""
    from microco.clients.compiler import _torch

    monkeypatch.setattr(AstraTorch, "_probe_whole_cache", lambda self, kind: None)  # no Inductor here
    monkeypatch.setattr(AstraTorch, "_count_graph_rewrites", lambda self: 0)  # as if the graph had none
    x, y = zm.synthetic_batch(3, 2, 4)
    keys, offered = [], []
    for total in (10**9, 2):
        model = zm.make_model("gru", 4, 8)
        astra = AstraTorch(model, _Null(), threads=("1",), total_steps=total, background=False)
        astra.whole_rewrites = 0 if total > 2 else -1  # the long run's probe found nothing to rewrite
        through_probe(astra, lambda m=model: zm.loss_fn(m(x), y).backward())
        keys.append(astra.spec().key)
        offered.append(sorted(v.name for v in astra.spec().variables if v.name in _torch.WHOLE.values()))
        astra.restore()
    assert offered[0] != offered[1]  # the runs offered different whole-step compiles ...
    assert keys[0] == keys[1]  # ... and find the same exploration
