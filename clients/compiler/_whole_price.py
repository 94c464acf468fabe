"""What a whole-step compile's price holds for (issue 18): the configuration a cache probe ran."""

from __future__ import annotations

from typing import Any


def probed_memory_format(model: Any) -> str:
    """The memory format the model's 4-d parameters are in now (the ``memory_format`` choice a
    probe of the step as given runs under): ``channels_last`` only when every one is."""
    four_d = [p for p in model.parameters() if p.dim() == 4]
    if not four_d:
        return "contiguous"
    import torch

    cl = all(p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous() for p in four_d)
    return "channels_last" if cl else "contiguous"
