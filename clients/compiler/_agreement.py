"""When two runs of a step agree: the judge both checks use, PyTorch's (``_equiv``) and
TensorFlow's (``_tf_equiv``), over the norms each has already taken. Pure; no framework."""

from __future__ import annotations

import math

TENSOR_SHARE = 5e-2  # one tensor's difference: at most this share of its norm or its group's mean


def judge(what: str, norms: list[float], diffs: list[float], rtol: float, whose: str) -> str:
    """The group as one vector within ``rtol`` of the reference (relative norm), and each tensor
    within ``TENSOR_SHARE`` of its own norm or the group's mean norm, whichever is larger (a
    gradient that is mathematically zero, a bias before a batch norm, is float noise of the size
    of the terms that cancel in it: judged against its group, not against itself). ``norms``:
    the reference's tensors' norms; ``diffs``: the norms of the differences (finite);
    ``whose``: the reference, as the reason names it. "" when they agree."""
    if not norms:
        return ""
    mean = sum(norms) / len(norms)
    for i, (n, d) in enumerate(zip(norms, diffs, strict=True)):
        if d > TENSOR_SHARE * max(n, mean):
            return f"{what} {i}: {d:.3g} apart, {whose} of norm {n:.3g} (group mean {mean:.3g})"
    total, apart = math.sqrt(sum(n * n for n in norms)), math.sqrt(sum(d * d for d in diffs))
    if apart > rtol * total:
        return f"{what}s: {apart:.3g} apart in all, {whose} of norm {total:.3g} (tolerance {rtol:g})"
    return ""
