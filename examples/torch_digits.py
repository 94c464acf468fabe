"""A small PyTorch model on scikit-learn's digits that runs under the microco scheduler.

    python -m microco.examples.torch_digits --steps 200 --out result.json

Outside the scheduler it simply trains. Under it (the node agent sets MICROCO_* variables)
the three hook lines make it report every mini-batch and obey suspend / resume /
checkpoint-and-move / resize at mini-batch boundaries, continuing exactly where it stopped.
Spread by the scheduler over several nodes (``MICROCO_WORLD_SIZE`` > 1) each rank trains on
its share of every global batch and gradients are averaged (gloo); the checkpoint is the same
as a single process's, so the job can be consolidated onto one node and continue.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time


def build(hidden: int):
    from torch import nn

    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 10))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="mini-batches to train")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-sleep-ms",
        type=float,
        default=0.0,
        help="extra time per mini-batch, to stand in for a bigger model",
    )
    p.add_argument("--out", help="write losses and a digest of the final parameters here (JSON)")
    args = p.parse_args(argv)

    import torch

    from microco.clients.scheduler import (
        StepBatches,
        TorchHook,
        average_gradients,
        init_distributed,
        seed_everything,
    )
    from microco.examples._digits import load_digits

    torch.set_num_threads(1)
    rank, world = init_distributed()
    seed_everything(args.seed)
    xs, ys = load_digits()
    x, y = torch.from_numpy(xs), torch.from_numpy(ys)
    model = build(args.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = StepBatches(len(x), args.batch_size, seed=args.seed)
    history: dict = {"losses": []}

    hook = TorchHook(model, opt, extra_state=history)
    start = hook.restore()
    for step in range(start, args.steps):
        idx = torch.from_numpy(batches.indices(step))[rank::world]  # this rank's share
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        average_gradients(model)
        opt.step()
        if world > 1:
            import torch.distributed as dist

            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= world
        history["losses"].append(loss.item())
        if args.step_sleep_ms:
            time.sleep(args.step_sleep_ms / 1000.0)
        hook.step_end(step + 1)
        if rank == 0 and ((step + 1) % 50 == 0 or step + 1 == args.steps):
            print(f"step {step + 1}/{args.steps}: loss {history['losses'][-1]:.3f}", flush=True)
    hook.finish()

    if args.out and rank == 0:
        digest = hashlib.sha256()
        for t in model.state_dict().values():
            digest.update(t.detach().cpu().numpy().tobytes())
        with open(args.out, "w") as f:
            json.dump(
                {
                    "losses": history["losses"],
                    "params_sha256": digest.hexdigest(),
                    "restored_from_step": hook.context.restored_from_step,
                    "steps": args.steps,
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
