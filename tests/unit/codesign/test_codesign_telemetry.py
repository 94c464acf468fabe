"""One job-side telemetry stream: the scheduler hook, the cache loader and the compiler wrapper
in one training loop measure each mini-batch once and read the same figures; each library
still works alone. No servers, no sockets."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _codesign import spy_wrapper, train

from microco.clients import telemetry
from microco.clients.cache import QuiverLoader
from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.clients.compiler.zoo import torch_models as zm
from microco.clients.scheduler import TorchHook
from microco.common import MemoryKV
from microco.services.cache import LocalStore, build_index

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _cache_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MICROCO_HOME", str(tmp_path_factory.mktemp("microco-home")))
    monkeypatch.setenv("MICROCO_COMPILE_COSTS", str(tmp_path_factory.mktemp("cc") / "costs.json"))


class CountingClock:
    def __init__(self) -> None:
        self.calls = 0
        self.t = 0.0

    def __call__(self) -> float:
        self.calls += 1
        self.t += 0.25  # each reading a quarter second later: figures are exact and known
        return self.t


def _loader(tmp_path, prefetch_batches=2):
    for i in range(24):
        (tmp_path / f"f{i:03d}").write_bytes(bytes([i]) * 200)
    store = LocalStore(str(tmp_path))
    idx = build_index(store.list_files(), store.read, 800)
    return QuiverLoader(
        idx, store, batch_size=4, dataset="d", job_id="j", server=None, prefetch_batches=prefetch_batches
    )


def _astra(model):
    explorer = LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1))
    return AstraTorch(
        model,
        explorer,
        name="lstm",
        total_steps=50,
        threads=("1",),
        compile_choices=("eager",),
        background=False,
    )


def _spy(obj, name, calls):
    real = getattr(obj, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    setattr(obj, name, spy)


@pytest.mark.parametrize("read_ahead", [True, False])
def test_three_libraries_in_one_loop_measure_each_step_once(tmp_path, read_ahead):
    torch.manual_seed(0)
    model = zm.make_model("lstm", 6, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    clock = CountingClock()
    hook = TorchHook(model, opt, telemetry=telemetry.StepTelemetry(clock=clock, cpu_clock=lambda: 0.0))
    stream = hook.context.telemetry
    assert telemetry.current() is stream
    loader = _loader(tmp_path, prefetch_batches=2 if read_ahead else 0)
    astra = _astra(model)
    records: list[telemetry.StepRecord] = []
    stream.subscribe(records.append)
    astra_ms, guard_ms = spy_wrapper(astra)  # (guard: what it adds for its rollback copies)
    meter: list = []
    _spy(loader._meter, "timings", meter)
    steps = train(loader, astra, hook, model, opt, zm.synthetic_batch(4, 8, 6, seed=0), 2)
    hook.finish()
    assert steps == 12
    # One clock reading per step (plus the stream's start), one record per step.
    assert clock.calls == steps + 1
    assert stream.published == steps == len(records)
    assert telemetry.current() is None  # the finished hook's stream is gone
    # Every library read the same record.
    assert hook.context._times[-1] == records[-1].step_s * 1000.0
    assert all(r.step_s == 0.25 for r in records)
    assert len(meter) == steps
    # the cache's stall meter prices each batch from its reads and the record's compute time
    # (the step's wait is not its input: docs/cache.md, "how the benefit is measured")
    for (_read, compute), rec in zip(meter, records, strict=True):
        assert compute == rec.compute_s
    assert loader.stats.compute_s == pytest.approx(sum(r.compute_s for r in records))
    # Every step is recorded (the first is the wrapper's probe) until the exploration commits
    # the model's own code; from then on the wrapper calls the step directly, records nothing.
    recorded = len(astra_ms)
    assert recorded == steps - 1 or astra.direct and 1 <= recorded < steps - 1
    for args, rec, guard in zip(astra_ms, records[1 : recorded + 1], guard_ms[1:], strict=True):
        assert args[0] == pytest.approx(rec.compute_s * 1e3 + guard, abs=1e-6)
    # The compiler's regions are in the stream's records (the LSTM cell runs as a region).
    assert any(r.regions_s for r in records[1:])
    astra.restore()
    loader.close()


def test_each_library_still_times_alone(tmp_path):
    assert telemetry.current() is None
    loader = _loader(tmp_path)
    meter: list = []
    _spy(loader._meter, "timings", meter)
    batches = sum(1 for _ in loader.epoch(0))
    assert batches == 6 and len(meter) == batches  # its own clock: compute per batch
    loader.close()

    model = zm.make_model("lstm", 6, 8)
    astra = _astra(model)
    recorded: list = []
    _spy(astra.session, "record", recorded)
    x, y = zm.synthetic_batch(4, 8, 6, seed=0)
    for _ in range(3):
        with astra.step():
            zm.loss_fn(model(x), y).backward()
    assert len(recorded) == 2 and all(a[0] > 0 for a in recorded)  # (the first step is the probe)
    astra.restore()


def test_a_stream_no_hook_ends_is_left_for_the_wrappers_own_clock():
    stream = telemetry.install(telemetry.StepTelemetry())
    model = zm.make_model("lstm", 6, 8)
    astra = _astra(model)
    recorded: list = []
    _spy(astra.session, "record", recorded)
    x, y = zm.synthetic_batch(4, 8, 6, seed=0)
    for _ in range(4):
        with astra.step():
            zm.loss_fn(model(x), y).backward()
    telemetry.uninstall(stream)
    # The first step waited for a record that never came; from the second on it times alone.
    assert astra._stream is None and len(recorded) >= 2
    astra.restore()
