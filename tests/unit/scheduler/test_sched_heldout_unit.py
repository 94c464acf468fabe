"""Held-out round (session 39): training code the platform's authors did not write, adapted to
the hooks the way the docs tell a user to, checkpointed and restarted mid-run; the restarted run
must end where an uninterrupted one ends. In process, no servers."""

from __future__ import annotations

import contextlib
import struct
import sys

import pytest

torch = pytest.importorskip("torch")

from microco.clients.scheduler import ControlChannel, TorchHook

pytestmark = pytest.mark.torch


class _Stopped(Exception):
    pass


def _raise_exit(code):
    raise _Stopped(code)


# ---------------------------------------------------------------- docs/first-job.md's script
class _NoCompiler:
    """``AstraTorch`` left out: this test is about the data position, not the compiler."""

    committed, config = False, None

    def __init__(self, *a, **k) -> None:
        pass

    def step(self):
        return contextlib.nullcontext()


def _run_first_job(monkeypatch, tmp_path, data, stop_at, attempt=0):
    """``examples/first_job.py``'s ``main`` as written, its data read by Quiver's loader from
    the folder (no cache server); a stop (checkpoint-and-move) is sent before step ``stop_at``."""
    from microco.clients.cache import QuiverLoader
    from microco.examples import first_job
    from microco.services.cache import LocalStore, build_index

    def open_loader(kv, dataset, batch_size, job_id):
        store = LocalStore(str(data))
        idx = build_index(store.list_files(), store.read, 4096)
        return QuiverLoader(idx, store, batch_size=batch_size, dataset=dataset, job_id=job_id, server=None)

    hooks: list[TorchHook] = []
    ctl = tmp_path / f"attempt-{attempt}"  # the agent gives each attempt its own control folder

    class Hook(TorchHook):
        def __init__(self, *a, **k):
            super().__init__(*a, exit_fn=_raise_exit, **k)
            hooks.append(self)

        def step_end(self, step=None):
            if stop_at is not None and step == stop_at:
                ControlChannel(ctl).send("stop")
            super().step_end(step)

    monkeypatch.setattr(first_job, "open_loader", open_loader)
    monkeypatch.setattr(first_job, "connect_etcd", lambda: None)
    monkeypatch.setattr(first_job, "AstraTorch", _NoCompiler)
    monkeypatch.setattr(first_job.RemoteExplorer, "from_etcd", staticmethod(lambda kv: None))
    monkeypatch.setattr(first_job, "TorchHook", Hook)
    monkeypatch.setattr(sys, "argv", ["first_job.py", "--epochs", "2"])
    monkeypatch.setenv("MICROCO_CONTROL_DIR", str(ctl))
    monkeypatch.setenv("MICROCO_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("MICROCO_CHECKPOINT_EVERY_S", "0")
    with contextlib.suppress(_Stopped):
        first_job.main()
    return hooks[-1]


def test_first_jobs_script_moved_mid_epoch_ends_as_an_uninterrupted_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROCO_HOME", str(tmp_path / "home"))
    data = tmp_path / "digits"
    data.mkdir()
    sample = struct.Struct("<B64f")
    g = torch.Generator().manual_seed(1)
    for i in range(320):  # 5 batches of 64 per epoch
        pixels = torch.rand(64, generator=g).tolist()
        (data / f"digit-{i:04d}.bin").write_bytes(sample.pack(i % 10, *pixels))

    whole = _run_first_job(monkeypatch, tmp_path / "a", data, stop_at=None)
    stopped = _run_first_job(monkeypatch, tmp_path / "b", data, stop_at=3)
    assert stopped.step == 3 and stopped.context.state == "checkpointed"
    moved = _run_first_job(monkeypatch, tmp_path / "b", data, stop_at=None, attempt=1)
    assert moved.context.restored_from_step == 3
    assert moved.step == whole.step == 10  # not the stopped epoch's trained batches again
    for name, value in whole.model.state_dict().items():
        assert torch.equal(moved.model.state_dict()[name], value), name
