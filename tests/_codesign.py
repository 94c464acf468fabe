"""What the co-design tests share (tests/unit/codesign, tests/integration/codesign): the
training loop of the three client libraries together, and the spy on what the compiler
wrapper takes from the telemetry stream."""

from __future__ import annotations

from typing import Any


def spy_wrapper(astra: Any) -> tuple[list[tuple], list[float]]:
    """(the arguments of every trial step the wrapper hands its session, what it adds for its
    rollback copies at each stream record it reads), filled as the loop runs."""
    recorded: list[tuple] = []
    guards: list[float] = []
    record, on_step = astra.session.record, astra._on_step

    def spy_record(*args: Any, **kwargs: Any) -> Any:
        recorded.append(args)
        return record(*args, **kwargs)

    def spy_on_step(rec: Any) -> None:
        guards.append(astra._deferred)
        on_step(rec)

    astra.session.record, astra._on_step = spy_record, spy_on_step
    return recorded, guards


def train(loader: Any, astra: Any, hook: Any, model: Any, opt: Any, batch: tuple, epochs: int) -> int:
    """``epochs`` of ``loader`` with the model's step inside the wrapper and the hook at each
    mini-batch's end (the zoo's loss on one fixed batch); the number of steps."""
    from microco.clients.compiler.zoo import torch_models as zm

    x, y = batch
    steps = 0
    for epoch in range(epochs):
        for _indices, _data in loader.epoch(epoch):
            with astra.step():
                loss = zm.loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            hook.step_end()
            steps += 1
    return steps
