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


# ---------------------------------------------------------------- the harness: one job process
def _hook_factory(ctl, ckpt, commands):
    """``TorchHook`` as a job process makes it, plus the agent's side: ``commands`` maps a step
    to the command sent just before that step's boundary (``suspend`` is resumed once acked)."""
    import threading

    made: list[TorchHook] = []

    class Hook(TorchHook):
        def __init__(self, *a, **k):
            k.setdefault("control_dir", str(ctl))
            k.setdefault("checkpoint_dir", str(ckpt))
            k.setdefault("checkpoint_every_s", 0)
            super().__init__(*a, exit_fn=_raise_exit, **k)
            made.append(self)

        def step_end(self, step=None):
            action = commands.get(step)
            if action:
                ch = ControlChannel(ctl)
                seq = ch.send(action)
                if action == "suspend":

                    def resume():
                        ch.wait_ack(seq, timeout=30)
                        ch.send("resume")

                    threading.Thread(target=resume, daemon=True).start()
            super().step_end(step)

    return Hook, made


def _moved(train, tmp_path, stop_at, suspend_at=None):
    """``train`` stopped (checkpoint-and-move) before the boundary of ``stop_at``, then started
    again as the next attempt; returns what the second process returned."""
    ckpt = tmp_path / "ckpt"
    hook, _ = _hook_factory(tmp_path / "attempt-0", ckpt, {stop_at: "stop", suspend_at: "suspend"})
    with pytest.raises(_Stopped):
        train(hook)
    hook, _ = _hook_factory(tmp_path / "attempt-1", ckpt, {})
    return train(hook)


# ---------------------------------------------------------------- pytorch/examples word_language_model
def _word_lm(Hook, epochs=3):
    """pytorch/examples' word_language_model/main.py (RNNModel: LSTM with dropout, tied
    decoder; plain SGD with lr annealed /4 when the validation loss does not improve, gradient
    clipping, the hidden state carried across the batches of an epoch), on a small synthetic
    corpus, adapted as docs/scheduler.md says: the global step, ``extra_state`` for what the
    loop keeps between batches and epochs, the epoch's end work before its last boundary."""
    from torch import nn

    torch.manual_seed(0)
    ntokens, bsz, bptt, nhid = 40, 4, 5, 16
    g = torch.Generator().manual_seed(0)
    train_data = torch.randint(ntokens, (bsz * 31,), generator=g).view(bsz, -1).t().contiguous()
    val_data = torch.randint(ntokens, (10 * 11,), generator=g).view(10, -1).t().contiguous()

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.2)
            self.encoder = nn.Embedding(ntokens, nhid)
            self.rnn = nn.LSTM(nhid, nhid, 2, dropout=0.2)
            self.decoder = nn.Linear(nhid, ntokens)
            self.decoder.weight = self.encoder.weight  # --tied

        def forward(self, x, hidden):
            out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
            return nn.functional.log_softmax(self.decoder(self.drop(out)), dim=-1).view(-1, ntokens), hidden

        def init_hidden(self, n):
            return (torch.zeros(2, n, nhid), torch.zeros(2, n, nhid))

    def repackage_hidden(h):
        return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)

    def get_batch(source, i):
        seq_len = min(bptt, len(source) - 1 - i)
        return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)

    model, criterion = RNNModel(), nn.NLLLoss()

    def evaluate(source):
        model.eval()
        total, hidden = 0.0, model.init_hidden(10)
        with torch.no_grad():
            for i in range(0, source.size(0) - 1, bptt):
                data, targets = get_batch(source, i)
                output, hidden = model(data, hidden)
                total += len(data) * criterion(output, targets).item()
        model.train()
        return total / (len(source) - 1)

    starts = list(range(0, train_data.size(0) - 1, bptt))
    nb = len(starts)
    state = {"lr": 5.0, "best_val_loss": None, "hidden": None, "losses": [], "val": []}
    hook = Hook(model, extra_state=state)  # no optimizer: the script updates p.data itself
    step = hook.restore()
    for _epoch in range(step // nb, epochs):
        hidden = state["hidden"] if step % nb else model.init_hidden(bsz)
        for batch in range(step % nb, nb):
            data, targets = get_batch(train_data, starts[batch])
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-state["lr"])
            state["hidden"], step = hidden, step + 1
            state["losses"].append(loss.item())
            if batch == nb - 1:  # the epoch's end work, before the epoch's last boundary
                val_loss = evaluate(val_data)
                state["val"].append(val_loss)
                if state["best_val_loss"] is None or val_loss < state["best_val_loss"]:
                    state["best_val_loss"] = val_loss
                else:
                    state["lr"] /= 4.0
            hook.step_end(step)
    hook.finish()
    return state, model, hook


@pytest.mark.parametrize("stop_at", [3, 6, 8], ids=["mid-epoch", "epoch-end", "suspended-first"])
def test_word_language_model_moved_ends_as_an_uninterrupted_run(tmp_path, stop_at):
    hook, _ = _hook_factory(tmp_path / "whole", tmp_path / "whole-ckpt", {})
    whole, whole_model, _ = _word_lm(hook)
    assert len(whole["losses"]) == 18 and len(set(whole["val"])) == 3 and whole["lr"] < 5.0  # annealed
    suspend_at = 5 if stop_at == 8 else None
    moved, moved_model, moved_hook = _moved(_word_lm, tmp_path, stop_at, suspend_at=suspend_at)
    assert moved_hook.context.restored_from_step == stop_at
    assert moved["losses"] == whole["losses"] and moved["val"] == whole["val"]
    assert moved["lr"] == whole["lr"]
    for name, value in whole_model.state_dict().items():
        assert torch.equal(moved_model.state_dict()[name], value), name


# ---------------------------------------------------------------- pytorch/examples mnist
def _mnist(Hook, workers=0, epochs=3, persistent=False):
    """pytorch/examples' mnist/main.py (a conv net with dropout, Adadelta, StepLR stepped after
    each epoch's test pass, a shuffling ``DataLoader``), on small synthetic images, with a
    GradScaler (GradScaler's scale grows every 2 steps: its state matters), kept as the user
    wrote it but for the hook's lines: ``stateful=`` for the scheduler and the scaler, and
    ``hook.epoch(train_loader)`` for the epoch's batches."""
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 1, 12, 12, generator=g), torch.randint(10, (96,), generator=g)
    train_loader = DataLoader(
        TensorDataset(x[:80], y[:80]),
        batch_size=16,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
    )
    test_loader = DataLoader(TensorDataset(x[80:], y[80:]), batch_size=16)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.fc1 = nn.Linear(4 * 5 * 5, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            return F.log_softmax(self.fc1(torch.flatten(self.dropout1(x), 1)), dim=1)

    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2)
    log = {"losses": [], "test": [], "lr": []}
    hook = Hook(model, optimizer, extra_state=log, stateful={"sched": scheduler, "scaler": scaler})
    step = hook.restore()
    for _epoch in range(step // len(train_loader), epochs):
        model.train()
        for data, target in hook.epoch(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            log["losses"].append(loss.item())
            step += 1
            hook.step_end(step)
        model.eval()
        with torch.no_grad():
            log["test"].append(sum(F.nll_loss(model(d), t, reduction="sum").item() for d, t in test_loader))
        scheduler.step()
        log["lr"].append(optimizer.param_groups[0]["lr"])
    hook.finish()
    return log, model, hook


@pytest.mark.parametrize(
    "stop_at,workers,persistent",
    [(7, 0, False), (5, 0, False), (12, 0, False), (7, 2, False), (7, 2, True), (5, 2, True)],
    ids=[
        "mid-epoch",
        "epoch-end",
        "suspended-at-an-epoch-end-then-moved",
        "mid-epoch-2-workers",
        "mid-epoch-persistent-workers",
        "epoch-end-persistent-workers",
    ],
)
def test_mnist_with_its_dataloader_moved_ends_as_an_uninterrupted_run(tmp_path, stop_at, workers, persistent):
    hook, _ = _hook_factory(tmp_path / "whole", tmp_path / "whole-ckpt", {})
    whole, whole_model, whole_hook = _mnist(hook, workers, persistent=persistent)
    assert len(whole["losses"]) == 15 and whole_hook.step == 15
    suspend_at = 10 if stop_at == 12 else None

    def train(h):
        return _mnist(h, workers, persistent=persistent)

    moved, moved_model, moved_hook = _moved(train, tmp_path, stop_at, suspend_at=suspend_at)
    assert moved_hook.context.restored_from_step == stop_at and moved_hook.step == 15
    assert moved == whole  # every loss, test loss and learning rate
    status = ControlChannel(tmp_path / "attempt-1").status()
    assert status["state"] == "finished" and status["step"] == 15
    assert status["restored_from_step"] == stop_at and status["minibatch_ms"] > 0
    for name, value in whole_model.state_dict().items():
        assert torch.equal(moved_model.state_dict()[name], value), name


def test_an_lr_scheduler_left_out_of_stateful_is_refused_by_name(tmp_path):
    """A OneCycleLR the hook is not told of would start over at every restart (the optimizer's
    LR restored, the schedule's position not): said at ``restore()`` and at a checkpoint."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = TorchHook(model, opt, checkpoint_dir=str(tmp_path))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10)  # after the hook
    with pytest.raises(ValueError, match=r"LR scheduler.*stateful=\{'sched': scheduler\}"):
        hook.restore()
    with pytest.raises(ValueError, match="LR scheduler"):
        hook.checkpoint()
    told = TorchHook(model, opt, checkpoint_dir=str(tmp_path), stateful={"sched": sched})
    assert told.restore() == 0 and told.checkpoint() > 0


# ---------------------------------------------------------------- pytorch/examples dcgan
def _dcgan(Hook, epochs=2):
    """pytorch/examples' dcgan/main.py (a generator and a discriminator, each with its own Adam,
    BCE, noise drawn every step, a shuffling loader), small: the generator and its optimizer
    are the hook's ``model`` and ``optimizer``, the discriminator and its optimizer are named
    in ``stateful=``."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(3)
    nz = 4
    data = torch.rand(48, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    dataloader = DataLoader(TensorDataset(data), batch_size=8, shuffle=True)
    netG = nn.Sequential(
        nn.ConvTranspose2d(nz, 8, 4, 1, 0),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.ConvTranspose2d(8, 1, 4, 2, 1),
        nn.Tanh(),
    )
    netD = nn.Sequential(
        nn.Conv2d(1, 8, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(8, 1, 4, 1, 0), nn.Sigmoid(), nn.Flatten(0)
    )
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    log = {"D": [], "G": []}
    hook = Hook(netG, optimizerG, extra_state=log, stateful={"netD": netD, "optimizerD": optimizerD})
    step = hook.restore()
    for _epoch in range(step // len(dataloader), epochs):
        for (real,) in hook.epoch(dataloader):
            netD.zero_grad()
            label = torch.full((real.size(0),), 1.0)
            errD_real = criterion(netD(real), label)
            errD_real.backward()
            fake = netG(torch.randn(real.size(0), nz, 1, 1))
            label.fill_(0.0)
            errD_fake = criterion(netD(fake.detach()), label)
            errD_fake.backward()
            optimizerD.step()
            netG.zero_grad()
            label.fill_(1.0)
            errG = criterion(netD(fake), label)
            errG.backward()
            optimizerG.step()
            log["D"].append((errD_real + errD_fake).item())
            log["G"].append(errG.item())
            step += 1
            hook.step_end(step)
    hook.finish()
    return log, (netG, netD), hook


@pytest.mark.parametrize("stop_at", [4, 6])
def test_dcgan_two_models_two_optimizers_moved_ends_as_an_uninterrupted_run(tmp_path, stop_at):
    hook, _ = _hook_factory(tmp_path / "whole", tmp_path / "whole-ckpt", {})
    whole, whole_nets, _ = _dcgan(hook)
    moved, moved_nets, moved_hook = _moved(_dcgan, tmp_path, stop_at, suspend_at=2)
    assert moved_hook.context.restored_from_step == stop_at and len(moved["G"]) == 12
    assert moved == whole
    for a, b in zip(whole_nets, moved_nets):
        for name, value in a.state_dict().items():
            assert torch.equal(b.state_dict()[name], value), name


def test_a_model_that_is_not_a_module_is_refused_at_once_with_the_way_to_pass_several(tmp_path):
    nets = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)]
    with pytest.raises(TypeError, match=r"model.*list.*stateful=\{'netD': netD"):
        TorchHook(nets, checkpoint_dir=str(tmp_path))


def test_hook_epoch_says_when_the_step_does_not_count_the_loaders_batches(tmp_path):
    from torch.utils.data import DataLoader

    hook = TorchHook(torch.nn.Linear(1, 1), checkpoint_dir=str(tmp_path))
    hook.restore()
    loader = DataLoader(list(range(8)), batch_size=2, shuffle=True)
    step = 0
    with pytest.raises(ValueError, match="took the step from 0 to 2, not 4: the step must count"):
        for i, _batch in enumerate(hook.epoch(loader)):
            if i % 2:  # a step per two batches (gradient accumulation)
                step += 1
                hook.step_end(step)


def test_hook_epoch_refuses_a_mid_epoch_checkpoint_without_the_epochs_rng_states(tmp_path):
    from torch.utils.data import DataLoader

    first = TorchHook(torch.nn.Linear(1, 1), checkpoint_dir=str(tmp_path))
    first.restore()
    for step in range(1, 4):  # a loop over its loader without hook.epoch
        first.step_end(step)
    first.checkpoint()
    again = TorchHook(torch.nn.Linear(1, 1), checkpoint_dir=str(tmp_path))
    assert again.restore() == 3
    with pytest.raises(ValueError, match="batch 3 of an epoch of 4.*without the epoch's RNG states"):
        next(iter(again.epoch(DataLoader(list(range(8)), batch_size=2, shuffle=True))))


def test_a_dataloader_given_as_the_sampler_is_refused_at_once_with_what_to_do(tmp_path):
    from torch.utils.data import DataLoader

    with pytest.raises(TypeError, match=r"sampler is a DataLoader.*hook.epoch\(loader\)"):
        TorchHook(torch.nn.Linear(1, 1), sampler=DataLoader(list(range(4))), checkpoint_dir=str(tmp_path))
