"""What an XLA compile will cost, priced from the graph XLA will compile.

The exploration core prunes a compiled choice whose compile cannot be repaid within the run, so
the price it is handed matters both ways: session 2 priced whole-step XLA at 1.5 s per cell call
(24 s for 16 time steps) and was wrong both ways (sru compiled in 7.5 s and was never tried;
milstm and lnlstm compiled for 67-171 s and lost). Here a choice's price is the number of HLO
instructions of the module XLA would compile (``experimental_get_compiler_ir(...)(stage="hlo")``
lowers the traced step to HLO without compiling code) times a per-instruction rate: a cold prior
measured on the development machine, replaced by the median of the rates measured on this
hardware as compiles happen (kept on disk per hardware id, so the next job, any model, starts from
the measured rate). Per exploration key the core calibrates further on its own (its measured
compile costs against the priors handed to it), and a choice's own measured cost replaces its
prior outright.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
from pathlib import Path
from typing import Any

from . import _compile_costs

# Cold prior (ms per HLO instruction: trace + lowering + XLA CPU compile of a training step),
# measured on the shared 2-core development machine, zoo cells at sequence 16, batch 16, input
# 32, hidden 64: 2.8 (sru, load 1.4) to 8.8 (lstm, load 5.5) ms per instruction for both the
# unrolled and the while-loop step. The middle of that range, chosen a priori, not fitted to the
# benchmark; measured rates replace it as soon as a compile on this hardware has been timed.
COLD_MS_PER_INSTRUCTION = 5.0

# A measured rate (compile ms / instruction) counts only within these bounds: a sample far
# outside means the timing was disturbed (a step stalled by another process), not a rate.
_RATE_BOUNDS = (0.05, 200.0)
_KEEP = 16  # latest samples kept per hardware id
_KEEP_SIZES = 256  # models whose module sizes are remembered per hardware id
_RATES_KEY = "ms_per_instruction_alone"  # rates as if alone on the machine (see ``observe``)


def hlo_instruction_count(hlo_text: str) -> int:
    """Instructions in an HLO module's text: one ``%name = ...`` line each, in every computation
    (while-loop bodies count once: they are compiled once, whatever the trip count)."""
    n = 0
    for line in hlo_text.splitlines():
        s = line.lstrip()
        if s.startswith(("%", "ROOT ")) and " = " in s and not s.endswith("{"):
            n += 1
    return n


def step_hlo_instructions(fn: Any, *args: Any) -> int:
    """HLO instruction count of ``fn`` (a ``tf.function(jit_compile=True)``) on ``args``: traces it
    (the trace is kept by ``fn`` and reused when it runs) and lowers it to HLO, compiling no code."""
    return hlo_instruction_count(fn.experimental_get_compiler_ir(*args)(stage="hlo"))


def unrolled_hlo_instructions(fn: Any, x: Any, y: Any) -> int:
    """HLO instruction count of an *unrolled* step ``fn`` over time-major ``x`` without tracing
    the whole sequence: the unrolled module is one copy of the cell per time step around a fixed
    part, so its size is linear in the sequence length (measured exact: lstm 352 + 15 x 162 = 2782
    at 16 steps, milstm 655 + 15 x 450 = 7405), and two traces of one and two steps give it.
    Tracing 16 steps took 5.5-13 s on the loaded machine (11 s for milstm), the two short
    traces 2-3 s; the estimate is needed before the explorer decides whether to compile at all."""
    steps = int(x.shape[0])
    if steps <= 2:
        return step_hlo_instructions(fn, x, y)
    one = step_hlo_instructions(fn, x[:1], y)
    two = step_hlo_instructions(fn, x[:2], y)
    return one + (steps - 1) * (two - one)


def default_cost_file() -> Path:
    """``$MICROCO_XLA_COST_FILE``, else ``~/.cache/microco/xla_compile_rate.json``."""
    env = os.environ.get("MICROCO_XLA_COST_FILE")
    if env:
        return Path(env)
    return Path(os.path.expanduser("~")) / ".cache" / "microco" / "xla_compile_rate.json"


def _parse_sizes(raw: Any) -> dict[str, dict[str, int]]:
    """Module sizes as stored (``{key: {kind: instructions}}``), anything malformed left out."""
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): {str(kind): n for kind, n in v.items() if isinstance(n, int) and n > 0}
        for k, v in raw.items()
        if isinstance(v, dict)
    }


class XlaCostModel:
    """Compile ms per HLO instruction on one hardware id, per kind of module (``"loop"``: a step
    whose time loop is a while loop; ``"unrolled"``: one cell copy per time step): the cold prior
    until compiles of that kind were measured, then the median of the measured rates (latest
    ``_KEEP``), persisted in ``path`` (``None``: in memory only). Kinds are kept apart because
    their rates differ: XLA's compile time grows faster than the module (measured: the unrolled
    milstm step, 7405 instructions, 16 ms per instruction; loop steps 1-5 ms per instruction)."""

    _lock = threading.Lock()

    def __init__(
        self, hardware: str, path: Path | str | None = None, cold_rate: float = COLD_MS_PER_INSTRUCTION
    ):
        self.hardware = hardware
        self.path = Path(path) if path is not None else None
        self.cold_rate = cold_rate
        self._samples: dict[str, list[float]] = {}
        # HLO sizes of the XLA modules of models seen on this host (see ``module_sizes``).
        self._sizes: dict[str, dict[str, int]] = {}
        self._load()

    def _read(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # an unreadable file is a cold start, not a failure of training
        return data if isinstance(data, dict) else {}

    def _load(self) -> None:
        mine = self._read().get(self.hardware, {})
        # Rates alone on the machine (divided by the contention they were measured at); the
        # older "ms_per_instruction" (load not recorded) is not read: a host measures again.
        kinds = mine.get(_RATES_KEY, {}) if isinstance(mine, dict) else {}
        if not isinstance(kinds, dict):
            kinds = {}
        self._samples = {
            str(k): [float(r) for r in v if isinstance(r, (int, float))][-_KEEP:]
            for k, v in kinds.items()
            if isinstance(v, list)
        }
        self._sizes = _parse_sizes(mine.get("module_sizes") if isinstance(mine, dict) else None)

    def module_sizes(self, key: str) -> dict[str, int] | None:
        """The HLO instruction counts remembered for ``key`` (a model's structure and input
        shapes), if a run on this host counted them: the next run skips the traces (measured
        about 3.5 s of a TF job's first step at sequence 8)."""
        got = self._sizes.get(key)
        return dict(got) if got else None

    def remember_module_sizes(self, key: str, sizes: dict[str, int]) -> None:
        self._sizes.pop(key, None)  # re-inserted last: the most recent
        self._sizes[key] = {k: int(n) for k, n in sizes.items()}
        self._save()

    def samples(self, kind: str = "loop") -> list[float]:
        return list(self._samples.get(kind, []))

    def rate(self, kind: str = "loop") -> float:
        """ms per HLO instruction for modules of ``kind``: the median measured rate, scaled from
        the load each was measured at to the load now (``_compile_costs.contention``), else the
        cold prior, scaled the same way."""
        got = self._samples.get(kind)
        # The cold prior too: it was measured with the 2 cores nearly to itself (load 1.4-5.5).
        return (statistics.median(got) if got else self.cold_rate) * _compile_costs.contention()

    def estimate(self, instructions: int, kind: str = "loop") -> float:
        """Expected compile time (ms) of a ``kind`` module of ``instructions`` HLO instructions."""
        return max(1, instructions) * self.rate(kind)

    def observe(self, instructions: int, compile_ms: float, kind: str = "loop") -> bool:
        """Record a measured compile (ms) of a ``kind`` module of ``instructions`` instructions;
        ``False`` if the sample was discarded as out of bounds."""
        if instructions <= 0 or not compile_ms > 0:
            return False
        r = compile_ms / instructions
        if not _RATE_BOUNDS[0] <= r <= _RATE_BOUNDS[1]:
            return False
        alone = r / _compile_costs.contention()
        self._samples[kind] = (self._samples.get(kind, []) + [alone])[-_KEEP:]
        self._save()
        return True

    def _save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            try:
                data = self._read()
                old = data.get(self.hardware)
                old_sizes = _parse_sizes(old.get("module_sizes") if isinstance(old, dict) else None)
                # Other processes' entries first, then this one's (its latest last); the oldest
                # go first beyond the bound, here and in memory.
                sizes = {k: v for k, v in old_sizes.items() if k not in self._sizes} | self._sizes
                while len(sizes) > _KEEP_SIZES:
                    sizes.pop(next(iter(sizes)))
                self._sizes = sizes
                data[self.hardware] = {_RATES_KEY: self._samples, "module_sizes": sizes}
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(data, indent=1))
                tmp.replace(self.path)
            except OSError:
                pass  # the rate is an optimisation: a read-only home must not stop training
