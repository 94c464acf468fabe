"""The demo's training job: every microco system in one ordinary PyTorch loop.

An LSTM reads each 8x8 scikit-learn digit as a sequence of 8 rows and classifies it. Three
small additions make it a microco job:

* the data comes through **Quiver** (``open_loader``): substitutable cache hits, every sample
  once per epoch, the backing store when the cache is cold or gone;
* each training step runs under **Astra** (``AstraTorch``): the compiler service picks a
  configuration per mini-batch, then commits the fastest;
* the **Gandiva** hook (``TorchHook``) reports each mini-batch's time and obeys suspend, resume
  and migration at mini-batch boundaries.

    python -m microco.examples.demo_job --etcd 127.0.0.1:2379 --dataset digits --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import struct

SAMPLE = struct.Struct("<B64f")  # label, 8x8 pixels: the on-disk format the demo writes


def encode_sample(label: int, pixels) -> bytes:  # type: ignore[no-untyped-def]
    return SAMPLE.pack(int(label), *(float(p) for p in pixels))


def decode_batch(raw: list[bytes]):  # type: ignore[no-untyped-def]
    import torch

    rows = [SAMPLE.unpack(r) for r in raw]
    y = torch.tensor([r[0] for r in rows], dtype=torch.long)
    x = torch.tensor([r[1:] for r in rows], dtype=torch.float32).view(-1, 8, 8) / 16.0
    return x.transpose(0, 1).contiguous(), y  # time-major: [rows, batch, pixels]


def build_model(hidden: int, seed: int):  # type: ignore[no-untyped-def]
    """A hand-written LSTM cell over the 8 rows (the long-tail shape Astra targets) and a head."""
    from microco.clients.compiler.zoo import torch_models

    return torch_models.make_model("lstm", input_size=8, hidden=hidden, classes=10, seed=seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--etcd", default=os.environ.get("MICROCO_ETCD", "127.0.0.1:2379"))
    p.add_argument("--dataset", default="digits", help="a dataset registered with the cache")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--user", default=os.environ.get("USER", "demo"))
    p.add_argument("--out", help="write the loss history and cache/compiler figures here (JSON)")
    args = p.parse_args(argv)

    import torch

    from microco.clients.cache import open_loader
    from microco.clients.compiler import AstraTorch, RemoteExplorer
    from microco.clients.scheduler import TorchHook, seed_everything
    from microco.common.kv import EtcdKV

    torch.set_num_threads(1)
    seed_everything(args.seed)
    kv = EtcdKV(args.etcd)
    job_id = os.environ.get("MICROCO_JOB_ID", f"local-{os.getpid()}")
    loader = open_loader(
        kv, args.dataset, batch_size=args.batch_size, job_id=job_id, user=args.user, seed=args.seed
    )
    model = build_model(args.hidden, args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps_per_epoch = len(loader)
    total = steps_per_epoch * args.epochs
    astra = AstraTorch(
        model, explorer=RemoteExplorer.from_etcd(kv), name="demo-digits-lstm", total_steps=total
    )
    history: dict = {"losses": []}
    hook = TorchHook(model, opt, extra_state=history)
    step = hook.restore()
    # After a resume the interrupted epoch starts over in a fresh order (the model keeps its state).
    for epoch in range(step // steps_per_epoch, args.epochs):
        for _indices, raw in loader.epoch(epoch):
            x, y = decode_batch(raw)
            with astra.step():
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            history["losses"].append(loss.item())
            step += 1
            hook.step_end(step)
    hook.finish()
    loader.finish()
    result = {
        "steps": step,
        "final_loss": history["losses"][-1] if history["losses"] else None,
        "cache_hit_rate": loader.stats.hit_rate,
        "compiler_committed": astra.committed,
        "compiler_explore_steps": astra.explore_steps,
        "compiler_config": astra.config,
    }
    loader.close()
    kv.close()
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**result, "losses": history["losses"]}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
