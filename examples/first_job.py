"""Your first job, on microco: ``first_job_plain.py`` with the three microco pieces added
(docs/first-job.md walks through each):

* the data comes through the **Quiver cache** (``open_loader``) from a dataset registered with
  ``microco cache register``;
* each training step runs under the **Astra compiler** wrapper (``AstraTorch``), which tries
  configurations one mini-batch at a time and keeps the fastest;
* the **Gandiva scheduler hook** (``TorchHook``) reports every mini-batch and obeys suspend,
  resume and migration at mini-batch boundaries, continuing from its checkpoint.

    python examples/first_job.py --write-data DIR   # the digits, one file per sample
    microco cache register digits DIR
    microco job submit --devices 1 --workdir "$PWD" -- python examples/first_job.py

The platform is found as every microco client finds it: ``MICROCO_ETCD`` (the node agent sets
it for its jobs), else the stack ``microco up`` runs on this machine.
"""

import argparse
import os
import struct
from pathlib import Path

import torch

from microco.clients.cache import open_loader
from microco.clients.compiler import AstraTorch, RemoteExplorer
from microco.clients.scheduler import TorchHook
from microco.common import connect_etcd

SAMPLE = struct.Struct("<B64f")  # one file per digit: its label, then its 8x8 pixels


def write_data(folder: Path) -> None:
    from microco.examples._digits import load_digits  # scikit-learn's digits, scaled to [0, 1]

    x, y = load_digits()
    folder.mkdir(parents=True, exist_ok=True)
    for i, (pixels, label) in enumerate(zip(x, y)):
        (folder / f"digit-{i:04d}.bin").write_bytes(SAMPLE.pack(int(label), *pixels))
    print(f"wrote {len(y)} samples to {folder}")


def decode(raw: list) -> tuple:
    rows = [SAMPLE.unpack(r) for r in raw]
    return torch.tensor([r[1:] for r in rows]), torch.tensor([r[0] for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write-data", type=Path, help="write the dataset into this folder and exit")
    p.add_argument("--dataset", default="digits", help="the name it was registered under")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    if args.write_data:
        return write_data(args.write_data)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    kv = connect_etcd()  # MICROCO_ETCD, else the local stack
    job_id = os.environ.get("MICROCO_JOB_ID", "local")  # set by the node agent
    loader = open_loader(kv, args.dataset, batch_size=64, job_id=job_id)  # Quiver
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = len(loader) * args.epochs
    astra = AstraTorch(model, RemoteExplorer.from_etcd(kv), name="first-job", total_steps=steps)  # Astra
    hook = TorchHook(model, opt, sampler=loader)  # Gandiva; the checkpoint keeps the data position
    step = hook.restore()  # 0, or where a checkpoint left off

    for epoch in range(step // len(loader), args.epochs):
        for _indices, raw in loader.epoch(epoch):
            x, y = decode(raw)
            with astra.step():
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            step += 1
            hook.step_end(step)
        print(
            f"epoch {epoch}: loss {loss.item():.3f}, cache hit rate {loader.stats.hit_rate:.0%}", flush=True
        )
    hook.finish()
    loader.finish()
    loader.close()
    print(
        f"done: {step} steps; compiler {'committed' if astra.committed else 'still exploring'} {astra.config}"
    )


if __name__ == "__main__":
    main()
