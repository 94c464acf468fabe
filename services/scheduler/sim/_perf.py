"""How fast a job runs where it is put: device-type speed and packing interference from
Gavel's measured throughputs, plus the cost of suspend/resume/migration.

Interference model for two jobs a, b packed on one device of type t, with device shares
u_a, u_b (fraction of the device each keeps busy alone): Gavel measured, for full-share
jobs, each one's packed throughput as a fraction r of its throughput alone. Jobs that
together need less than the device interfere little, so the measured slowdown is scaled
by the contention ``c = clamp(u_a + u_b - 1, c_min, 1)``: ``speed_a = 1 - (1 - r_a) * c``.
Pairs Gavel could not co-locate (0 throughput: out of memory) get ``speed = 0.01``: the
pack makes no progress and the introspective policy must notice and undo it.

Solo busy fraction (how much of its device a job keeps busy when it runs alone): a job that
keeps its speed while another job shares its device was not keeping the device busy alone.
For model X on device type t, let ``s_X = 2 * r(X, X)`` be the combined normalised
throughput Gavel measured for X packed with a copy of itself. If the pair saturates the
device (the assumption), X alone keeps it busy ``u_X = min(1, 1 / s_X)`` of the time
(ResNet-18 b64 on v100: s = 2.0, u = 0.5; Transformer b64: s = 1.49, u = 0.67; ResNet-50
b64: s = 1.0, u = 1.0). When the self pair is missing or 0 (out of memory) nothing can be
said, and the job is taken to keep its device fully busy (u = 1: the conservative choice,
it never inflates packing gains). A pod's busy fraction alone is ``gpu_share x u_X``.
This busy fraction feeds utilisation only: packed *speeds* of full-share jobs stay the
measured ones (the contention above uses the requested shares, not u).
"""

from __future__ import annotations

import ast
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MINIBATCH_MS = 100.0


@dataclass(frozen=True)
class CostModel:
    """Seconds a job makes no progress after each mechanism acts on it.

    The defaults are session 1's hand-set guesses (profile ``"session1"``); the live
    scheduler's own measurements come in through :meth:`from_scheduler_bench` (profile
    ``"measured"``; mapping in docs/scheduler-sim.md, "Costs")."""

    start_s: float = 5.0  # launch a process, build the model, first data
    suspend_s: float = 1.0  # checkpoint at a mini-batch boundary (charged to the next job)
    resume_s: float = 5.0  # restore a checkpoint
    migrate_s: float = 10.0  # checkpoint, copy, restore elsewhere
    resize_s: float = 5.0  # elastic re-configuration

    @classmethod
    def from_scheduler_bench(cls, source: str | os.PathLike | dict) -> CostModel:
        """Costs measured by the live scheduler's benchmark (``microco bench scheduler
        --json``: a file or its parsed JSON). Mapping, each the time a job makes no
        progress in the live system:

        * ``suspend_s`` = ``suspend_ms``: SUSPEND command until the job is parked at its
          mini-batch boundary with its checkpoint written (the device is held until then;
          charged, as before, to the job that takes the freed device);
        * ``resume_s`` = ``resume_ms``: RESUME command until the parked job runs again;
        * ``start_s`` = ``migration.migrate_restart_ms``: a process forked from the node's
          warm zygote until its first mini-batch is done (a fresh start takes the same
          path as the restart half of a migration, with an empty checkpoint to load);
        * ``migrate_s`` = ``migrate_ms``: checkpoint-and-exit on one node plus that restart
          on the other;
        * ``resize_s`` = ``resume_ms``: the live scheduler re-pins a job on its own node at
          the next boundary (the same control path as a resume, no restart).

        Raises ValueError naming the missing field when the JSON is not such a benchmark.
        """
        if isinstance(source, dict):
            raw, where = source, "benchmark JSON"
        else:
            where = str(source)
            try:
                raw = json.loads(Path(source).read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"{where}: not a readable JSON file ({exc})") from None
        if not isinstance(raw, dict):
            raw = {}  # not the benchmark's object: the first field lookup below says so

        def ms(*path: str) -> float:
            v: object = raw
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(
                    f"{where}: no usable {'.'.join(path)} (milliseconds) in it; "
                    "expected the output of `microco bench scheduler --json`"
                )
            return float(v) / 1000.0

        resume = ms("resume_ms")
        return cls(
            start_s=ms("migration", "migrate_restart_ms"),
            suspend_s=ms("suspend_ms"),
            resume_s=resume,
            migrate_s=ms("migrate_ms"),
            resize_s=resume,
        )


# Named cost profiles. "session1": the hand-set guesses every figure before session 3 used.
# The measured profile is not a constant: it is read from a benchmark file
# (CostModel.from_scheduler_bench, `--costs-from FILE`).
COST_PROFILES: dict[str, CostModel] = {"session1": CostModel()}


class PerfModel:
    """Per (model, device type) mini-batch time and per pair packed speed."""

    def __init__(
        self,
        alone: dict[str, dict[str, float]],
        pairs: dict[str, dict[tuple[str, str], float]],
        *,
        reference_device: str = "v100",
        contention_min: float = 0.1,
        unknown_pair_ratio: float = 0.5,
        spread_factor: float = 0.8,
        elastic_efficiency: float = 0.9,
    ) -> None:
        self.alone = alone  # device type -> model -> steps/s alone
        self.pairs = pairs  # device type -> (model, other) -> fraction of alone
        self.reference_device = reference_device
        self.contention_min = contention_min
        self.unknown_pair_ratio = unknown_pair_ratio
        self.spread_factor = spread_factor
        self.elastic_efficiency = elastic_efficiency
        self._cache: dict[tuple, float] = {}
        self.unknown_busy = 1.0  # solo busy fraction when Gavel has no usable self pair

    @classmethod
    def from_gavel(cls, path: str | os.PathLike, **kw) -> PerfModel:
        """Load ``gavel_throughputs.json`` (one-worker entries; consolidated placements)."""
        with Path(path).open() as fh:
            raw = json.load(fh)
        alone: dict[str, dict[str, float]] = {}
        pairs: dict[str, dict[tuple[str, str], float]] = {}
        for dev, table in raw.items():
            if "unconsolidated" in dev:
                continue
            a: dict[str, float] = {}
            p: dict[tuple[str, str], float] = {}
            for key, entry in table.items():
                model, scale = ast.literal_eval(key)
                if scale != 1:
                    continue
                base = float(entry.get("null") or 0.0)
                if base <= 0:
                    continue
                a[model] = base
                for other_key, val in entry.items():
                    if other_key == "null":
                        continue
                    other, oscale = ast.literal_eval(other_key)
                    if oscale != 1:
                        continue
                    p[(model, other)] = max(0.0, float(val[0])) / base
            alone[dev.lower()] = a
            pairs[dev.lower()] = p
        return cls(alone, pairs, **kw)

    @classmethod
    def uniform(cls, **kw) -> PerfModel:
        """No measurements: every model the same speed everywhere, packed pairs at 0.5."""
        return cls({}, {}, **kw)

    # ------------------------------------------------------------------ queries
    def unknown_models(self, models: Iterable[str]) -> list[str]:
        """The named models this model has no measurement of on any device (sorted). Such a
        job runs at ``DEFAULT_MINIBATCH_MS``, keeps its device busy (``unknown_busy``) and packs
        at ``unknown_pair_ratio``. Empty for the uniform model, which measures nothing on purpose."""
        known = {m for table in self.alone.values() for m in table}
        if not known:
            return []
        return sorted({m for m in models if m and m not in known})

    def minibatch_ms(self, model: str, device: str) -> float:
        sps = self.alone.get(device.lower(), {}).get(model)
        return 1000.0 / sps if sps else DEFAULT_MINIBATCH_MS

    def device_speed(self, model: str, device: str) -> float:
        """Speed on ``device`` relative to the reference device (1.0 when unknown)."""
        key = ("dev", model, device)
        v = self._cache.get(key)
        if v is None:
            ref = self.alone.get(self.reference_device, {}).get(model)
            here = self.alone.get(device.lower(), {}).get(model)
            v = here / ref if ref and here else 1.0
            self._cache[key] = v
        return v

    def pair_ratio(self, model: str, other: str, device: str) -> float:
        """Measured packed/alone throughput of ``model`` next to ``other`` (full shares)."""
        key = ("pair", model, other, device)
        v = self._cache.get(key)
        if v is None:
            table = self.pairs.get(device.lower()) or self.pairs.get(self.reference_device, {})
            v = table.get((model, other))
            if v is None:
                v = self.unknown_pair_ratio
            self._cache[key] = v
        return v

    def solo_busy(self, model: str, device: str) -> float:
        """Fraction of the device a full-share job of ``model`` keeps busy alone:
        ``min(1, 1 / (2 * r(model, model)))`` from Gavel's self pair (module docstring);
        ``unknown_busy`` (1.0) when the self pair is missing or 0, or the model unknown."""
        key = ("busy", model, device)
        v = self._cache.get(key)
        if v is None:
            table = self.pairs.get(device.lower()) or self.pairs.get(self.reference_device, {})
            r = table.get((model, model))
            v = min(1.0, 1.0 / (2.0 * r)) if r and r > 0 else self.unknown_busy
            self._cache[key] = v
        return v

    def packed_speed(self, model: str, share: float, others: list[tuple[str, float]], device: str) -> float:
        """Fraction of its alone speed a job keeps when sharing a device with ``others``
        (each a (model, share)). 1.0 when alone.

        The contention is how far the device's requests exceed it: ``c = clamp(share +
        sum(other shares) - 1, contention_min, 1)``, and each other job slows this one by
        its measured pair slowdown scaled by ``c``. With one other job this is the pair
        formula of the module docstring; with more, a device whose requests add up to
        more than one is contended for every pair on it, even when each pair alone fits."""
        speed = 1.0
        c = min(1.0, max(self.contention_min, share + sum(osh for _, osh in others) - 1.0))
        for om, _ in others:
            r = self.pair_ratio(model, om, device)
            if r <= 0:
                return 0.01
            speed *= 1.0 - (1.0 - r) * c
        return max(0.01, speed)


def default_perf_model(traces_dir: Path | None) -> PerfModel:
    """Gavel's measurements when the traces are present, else the uniform model."""
    if traces_dir is not None:
        p = Path(traces_dir) / "gavel_throughputs.json"
        if p.exists():
            return PerfModel.from_gavel(p)
    return PerfModel.uniform()
