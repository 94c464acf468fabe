"""What compiles cost on this host, learned from the compiles run here (issue 18).

A compile's cost is a property of the host as much as of the graph: its cores and load, and
above all whether Inductor's (or XLA's) on-disk caches there already hold the code. Priors fixed
in the code were wrong by an order of magnitude both ways (a whole-step compile priced per cell
call at 256-512 s measured 40-343 s; an XLA step priced at 10.9 s compiled in 3.0 s), so every
compile that runs is measured and kept here, per host and per kind of compile, and the next
estimate of that kind on this host is taken from them:

* the median of the last ``KEEP`` measurements of the kind, per unit of graph size where both
  the measurements and the new graph have one (FX nodes of the graph compiled), else the plain
  median;
* ``None`` when this host has not compiled that kind yet: the caller keeps its cold prior.

Kinds are the compile paths, e.g. ``torch:whole:plain``, ``torch:whole:rewrite``,
``torch:region:inductor``. The record lives on the host, beside the compiler caches it
describes (``$MICROCO_COMPILE_COSTS``, default ``~/.cache/microco/compile_costs.json``), keyed by
host name and hardware: a cost measured on a warm host says nothing about a cold one, which is
why the service's per-key record (etcd, cluster-wide) is not the source of these estimates.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KEEP = 20

# A trial's compile is abandoned past its deadline (session 11; TF: ``_tf_warm``, PyTorch:
# ``AstraTorch``'s in-line compile timer).
DEADLINE_FACTOR = 3.0  # a priori: a price within 3x of the truth is a price; beyond, a guess
MIN_DEADLINE_MS = 10_000.0  # a priori: below ~10 s, thread start and tracing noise dominate


def most_saving_ms(steps_left: int, base_ms: float | None) -> float | None:
    """The most a compile could save over the ``steps_left`` at the baseline's typical step
    ``base_ms`` (at best twice as fast: half a step saved a step); None when ``base_ms`` is
    unknown."""
    if base_ms is None or not math.isfinite(base_ms) or base_ms <= 0:
        return None
    return 0.5 * base_ms * max(0, steps_left)


def compile_deadline_ms(price_ms: float, steps_left: int, base_ms: float | None) -> float:
    """How long a trial's compile may run before it is abandoned: ``DEADLINE_FACTOR`` x its
    price (at least ``MIN_DEADLINE_MS``), and never longer than the most it could save
    (``most_saving_ms``). ``base_ms`` unknown: the factor alone."""
    allowed = max(MIN_DEADLINE_MS, DEADLINE_FACTOR * max(0.0, price_ms))
    most = most_saving_ms(steps_left, base_ms)
    return allowed if most is None else min(allowed, most)


# How a cold Inductor compile of a whole training step (forward and backward) grows with its
# graph: a fixed part and a part per FX node of the graphs dynamo hands over (issue 18, session
# 30). Measured on reference graphs, not on any corpus model: a residual stack of Linear, GELU
# and LayerNorm blocks of 16 to 148 nodes, each compiled cold into a fresh Inductor cache after a
# first compile in the process, one thread (2-core VM, torch 2.13 CPU, load 0.4-0.8): 2.5-2.7 s
# at 16 nodes, 4.0 s at 40, 5.8-6.3 s at 76, 9.2 s at 148: 1.8 s plus 50 ms a node. The shape
# prices a graph by its size; its scale is this host's (``compile_scale``).
WHOLE_FIXED_MS = 1800.0
WHOLE_NODE_MS = 50.0
# Inductor's first compile in a process pays once for what every later compile reuses (its code
# generators' imports, the C++ toolchain's first calls): 6.3 s more for the same 16-node graph as
# a process's first compile than as its second (8.9 against 2.6 s; 5.5 s in a second process).
FIRST_IN_PROCESS_MS = 6000.0
_inductor_compiled = False  # this process has compiled a graph with Inductor


def compile_curve_ms(size: int) -> float:
    """The reference shape of a cold whole-step compile of ``size`` FX nodes (ms, scale 1)."""
    return WHOLE_FIXED_MS + WHOLE_NODE_MS * max(0, size)


# The same compile priced by what it compiles, counted before anything is traced (issue 18,
# session 38; ``_op_count``): the distinct ATen ops (an op and its arguments' shapes, views left
# out) the probe step dispatches from the model's forward to the optimiser's update. The FX
# curve above, fitted on a stack of Linear, GELU and LayerNorm blocks, priced MobileViT's 774
# nodes at 61 s where its compile took 112-135 s. Fitted here on the CPU time (the process's and
# its compiler subprocesses') of cold Inductor compiles of nine models of 19 to 96 distinct ops
# (two conv stacks, torch's TransformerEncoder and LSTMCell loop, HF BERT, DistilBERT, Llama,
# GPT-2, ResNet), each the second compile in its process, at the calibration's median measured
# speed (1.46): 5.2 s plus 164 ms a distinct op, within 0.84-1.27x of each; the curve is that fit
# at its highest ratio (1.27), as ``first_price`` takes the highest scale: an underpriced
# compile costs the run minutes, an overpriced one waits for a longer run. (docs/compiler.md,
# "A compile priced by the distinct ops it compiles"; MobileViT, held out of the fit, 219
# distinct ops, compiled in 2.1x the curve.)
OP_FIXED_MS = 6600.0
OP_MS = 209.0


def op_curve_ms(ops: int) -> float:
    """The reference shape of a cold whole-step compile of a step of ``ops`` distinct ATen ops
    (ms, scale 1, the reference host's speed)."""
    return OP_FIXED_MS + OP_MS * max(0, ops)


def mark_inductor_compiled() -> None:
    """Note that this process has run an Inductor compile: the next pays no first-compile cost."""
    global _inductor_compiled
    _inductor_compiled = True


def inductor_compiled() -> bool:
    return _inductor_compiled


# The host-speed probe: CPU time (ms, median) of one FX symbolic trace of a small reference
# module, which runs the same kind of Python (graph building, dispatch, dictionaries) as most of
# a compile. Measured on the reference host of ``compile_curve_ms``: 2.19-2.36 ms.
SPEED_REFERENCE_MS = 2.3
SPEED_KIND = "speed:fx-trace"
SPEED_FLOOR = 0.25  # no host is taken as more than 4x the reference host's speed


def measure_host_speed(reps: int = 7) -> float:
    """This host's compile speed against the reference host's (above 1: slower), from the CPU
    time of ``reps`` FX traces of a reference module (the first, a warm-up, dropped); about
    20 ms. CPU time, not wall: other processes' load is the caller's contention, not speed."""
    import statistics

    import torch
    from torch import fx, nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lins = nn.ModuleList(nn.Linear(8, 8) for _ in range(8))
            self.norm = nn.LayerNorm(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for lin in self.lins:
                x = self.norm(nn.functional.gelu(lin(x))) + x
            return x

    # Built on a fork of the random streams: the layers' initialisation draws from the global
    # generator, and a first run on a host (when this is measured, in the first step) then
    # trained on other random numbers than the same run without the compiler (held out, session
    # 32: a ViT-MAE's masks, drawn by ``torch.rand`` in its forward, differed from the second
    # step on, its loss 2.8% from eager's).
    with torch.random.fork_rng(devices=[]):
        block = Block()
    times = []
    for _ in range(reps + 1):
        c0 = time.process_time()
        fx.symbolic_trace(block)
        times.append((time.process_time() - c0) * 1e3)
    return max(SPEED_FLOOR, statistics.median(times[1:]) / SPEED_REFERENCE_MS)


def default_path() -> Path:
    env = os.environ.get("MICROCO_COMPILE_COSTS")
    if env:
        return Path(env)
    from .explore._filekv import default_dir

    return default_dir() / "compile_costs.json"  # beside the tuned configurations (compiler_state.json)


def contention() -> float:
    """How many runnable threads share each core (the 1-minute load average over the cores, at
    least 1): a compile measured at contention ``c`` took about ``c`` times what it takes alone.
    Measured here (XLA, the same step, 2 cores): 35.1 s at load 35, 10.5 s at load 13-20."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / float(os.cpu_count() or 1))


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class HostCompileCosts:
    """Measured compile times of this host, by kind, persisted in a small JSON file."""

    def __init__(self, path: Path | str | None = None, host: str | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.host = host or socket.gethostname()

    # -- persistence (a missing or unreadable file is an empty record: estimates fall back)
    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".compile_costs.")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)  # atomic: a concurrent reader sees the old or the new file
        except OSError as exc:
            log.info("compile costs not saved (%s)", exc)

    def _key(self, hardware: str) -> str:
        return f"{self.host}|{hardware}"

    # -- API
    def record(
        self,
        hardware: str,
        kind: str,
        ms: float,
        size: int = 0,
        graph: str = "",
        warm: bool = False,
        floor: bool = False,
        ask: float | None = None,
        step: float = 0.0,
        cpu: float = math.nan,
        ops: int = 0,
    ) -> None:
        """Keep one measured compile of ``kind`` (``size``: nodes of the graph compiled, 0 unknown;
        ``ops``: the distinct ATen ops of the step compiled, counted in its probe step, 0
        unknown, see :meth:`op_price`;
        ``graph``: which graph, see :meth:`estimate`; ``warm``: the compile was served by the
        compiler's caches, a load and not a compile; ``ask``: of a load's ``ms``, what the ask
        that found it in the caches cost, 0 where none did, see :meth:`warm_load`; ``step``: the
        eager step's ms of the graph traced, see :meth:`per_step`; ``cpu``: of a load's ``ms``,
        the CPU time of the thread that ran it, see :meth:`_at_load`)."""
        if not ms > 0:
            return
        data = self._load()
        rows = data.setdefault(self._key(hardware), {}).setdefault(kind, [])
        row: dict[str, Any] = {
            "ms": float(ms),
            "size": int(size),
            "at": time.time(),
            "contention": contention(),
        }
        if graph:
            row["graph"] = graph
        if warm:
            row["warm"] = True
        if floor:
            row["floor"] = True  # abandoned at its deadline after ``ms``: it costs at least that
        if ask is not None:
            row["ask"] = float(ask)
        if step > 0:
            row["step"] = float(step)
        if warm and math.isfinite(cpu) and cpu > 0:
            row["cpu"] = float(cpu)
        if ops > 0:
            row["ops"] = int(ops)
        rows.append(row)
        del rows[:-KEEP]
        self._save(data)

    def measurements(self, hardware: str, kind: str) -> list[dict[str, Any]]:
        return list(self._load().get(self._key(hardware), {}).get(kind, []))

    @staticmethod
    def _at_load(
        rows: list[dict[str, Any]], now: float, slowdown: float | None = None
    ) -> list[dict[str, Any]]:
        """The rows' times scaled from the contention each was measured at to ``now``'s (a row
        that did not record it is taken as measured at ``now``'s).

        A load (``warm``) is never priced below what it took alone (issue 18, session 24): the
        contention a row keeps is the 1-minute load average, which lags (a load recorded at 1.55
        just after the static contender's compile had met no other work: Llama's, 1,345 ms,
        priced 868 ms at 1.0, took 1,323-1,691 ms there). Measured here on loads alone
        (docs/compiler.md, "A warm load's price"): a load's wall time is its thread's CPU time
        times the runnable threads per core it met, not times the load average kept with it.
        So a load that kept its CPU time is priced at that CPU time at ``now``'s contention;
        one that did not, at its own time scaled up to ``now`` and never down. ``slowdown`` given
        (the caller's, at which it prices the saving it weighs a load against; issue 18, session
        26): a load that kept its CPU time at that, not at ``now``."""
        out = []
        for r in rows:
            then = r.get("contention")
            scale = now / then if isinstance(then, (int, float)) and then > 0 else 1.0
            ms = float(r.get("ms", 0.0)) * scale
            if r.get("warm"):
                cpu = r.get("cpu")
                if isinstance(cpu, (int, float)) and cpu > 0:
                    ms = float(cpu) * max(1.0, now if slowdown is None else slowdown)
                else:
                    ms = float(r.get("ms", 0.0)) * max(1.0, scale)
            out.append({**r, "ms": ms})
        return out

    def estimate(
        self,
        hardware: str,
        kind: str,
        size: int = 0,
        graph: str = "",
        warm: bool = False,
        slowdown: float | None = None,
    ) -> float | None:
        """The expected compile time (ms) of a graph of ``size`` nodes of ``kind`` on this host,
        from its measurements scaled to the machine's load now; None when none was measured
        here.

        ``graph`` given (session 11): only that graph's own measurements count, and only those of
        the same temperature (``warm``: served by the caches; cold: compiled). A price is not
        borrowed across graphs: found in the corpus, a rate learned on recurrent cells priced a
        CNN's compile that then took minutes, and a cache hit's lookup priced a trial whose load
        and warm-up cost far more. None: the caller's prior for a graph never compiled here.
        Without ``graph`` (older callers), the rows of every graph, as before. ``slowdown``: a
        load's CPU time at that (``_at_load``)."""
        if graph:
            now = contention()
            mine = [
                r
                for r in self._at_load(self.measurements(hardware, kind), now, slowdown)
                if r.get("graph") == graph and bool(r.get("warm")) == warm
            ]
            own = [r["ms"] for r in mine if not r.get("floor")]
            floors = [r["ms"] for r in mine if r.get("floor")]
            if not own and not floors:
                return None
            # A compile abandoned at its deadline cost at least that: never priced below it.
            return max(_median(own) if own else 0.0, max(floors) if floors else 0.0)
        rows = [r for r in self.measurements(hardware, kind) if not r.get("warm") and not r.get("floor")]
        rows = self._at_load(rows, contention())
        if not rows:
            return self._other_kinds_estimate(hardware, kind, size)
        sized = [r["ms"] / r["size"] for r in rows if r.get("size", 0) > 0]
        if size > 0 and sized:
            return _median(sized) * size
        return _median([r["ms"] for r in rows])

    # -- what loading a compile found in the caches costs here (issue 18, session 22)
    # An old load row (before ``ask`` was kept) carries the ask of its graph recorded at most this
    # long before it: the ask and the trial's first compiled step are one run's, seconds apart.
    ASK_PAIRED_WITHIN_S = 300.0

    def warm_load(self, hardware: str, kind: str, ask_kind: str, size: int = 0) -> float | None:
        """What loading a compile of ``kind`` that an ask found in the caches cost this host
        beyond that ask, learned across graphs: each load's ``ms`` less its ask (kept with the
        load; in an older row, its graph's ``ask_kind`` row just before it, else none), at
        today's load; per node times ``size`` where it and the loads' sizes are known, else the
        median, never below what it took (``_at_load``). Loads no ask found (after a background
        compile: their trace is in them) do not count. None: no load measured here (the caller's prior)."""
        rows = self.measurements(hardware, kind)
        asks = self.measurements(hardware, ask_kind)
        now = contention()
        beyond: list[tuple[float, int]] = []
        for r in rows:
            if not r.get("warm") or r.get("floor") or not r.get("graph"):
                continue
            ask = r.get("ask")
            if not isinstance(ask, (int, float)):
                at = float(r.get("at", 0.0))
                before = [
                    a
                    for a in asks
                    if a.get("graph") == r["graph"]
                    and 0.0 <= at - float(a.get("at", 0.0)) <= self.ASK_PAIRED_WITHIN_S
                ]
                ask = float(max(before, key=lambda a: float(a.get("at", 0.0)))["ms"]) if before else 0.0
            if not ask > 0:
                continue  # a load no ask found (after a background compile): its trace is in it
            then = r.get("contention")
            # (never below what it took: the contention kept with it lags, ``_at_load``)
            scale = max(1.0, now / then) if isinstance(then, (int, float)) and then > 0 else 1.0
            beyond.append((max(0.0, float(r.get("ms", 0.0)) - float(ask)) * scale, int(r.get("size", 0))))
        if not beyond:
            return None
        sized = [ms / n for ms, n in beyond if n > 0]
        if size > 0 and sized:
            return _median(sized) * size
        return _median([ms for ms, _ in beyond])

    def per_step(self, hardware: str, kind: str, step_ms: float) -> float | None:
        """A trace of a graph never traced here (``kind``: a cache ask, a capture), priced by the
        other graphs' traces here relative to their eager step (``step``, timed beside it, so at
        its load): the median ratio times ``step_ms``, this graph's step now (issue 18, session
        22: dynamo's trace walks the Python the eager step runs; measured here, the held-out
        Llama, DistilBERT and BART, 82-224 probe steps an ask, median 134-140, where the asks
        themselves ran 0.9-2.5 s). None: no trace here recorded its step."""
        if not step_ms > 0:
            return None
        ratios = [
            float(r["ms"]) / float(r["step"])
            for r in self.measurements(hardware, kind)
            if isinstance(r.get("step"), (int, float)) and r["step"] > 0 and not r.get("floor")
        ]
        return _median(ratios) * step_ms if ratios else None

    def last_size(self, hardware: str, kind: str, graph: str) -> int:
        """The size (nodes) ``graph``'s last measurement of ``kind`` here had; 0: none known."""
        sizes = [int(r.get("size", 0)) for r in self.measurements(hardware, kind) if r.get("graph") == graph]
        return sizes[-1] if sizes else 0

    # -- what a compile gained here (issue 18, session of 2026-12-03)
    def record_gain(self, hardware: str, kind: str, ratio: float, graph: str) -> None:
        """Keep the speedup a compile of ``kind`` gave ``graph`` on this host: the baseline's step
        over the compiled one's, measured interleaved (the exploration's confirming A/B), at one
        load: a ratio, not scaled by the load as a compile time is."""
        if not (ratio > 0 and math.isfinite(ratio)) or not graph:
            return
        data = self._load()
        rows = data.setdefault(self._key(hardware), {}).setdefault(f"gain:{kind}", [])
        rows.append({"ratio": float(ratio), "at": time.time(), "graph": graph})
        del rows[:-KEEP]
        self._save(data)

    def gain(self, hardware: str, kind: str, graph: str) -> float | None:
        """The median speedup a compile of ``kind`` gave ``graph`` here; None: never measured."""
        rows = [r for r in self.measurements(hardware, f"gain:{kind}") if r.get("graph") == graph]
        ratios = [float(r["ratio"]) for r in rows if isinstance(r.get("ratio"), (int, float))]
        return _median(ratios) if ratios else None

    def gains(self, hardware: str, kind: str) -> dict[str, float]:
        """Every graph's median speedup of a compile of ``kind`` here (:meth:`gain`), by graph."""
        by: dict[str, list[float]] = {}
        for r in self.measurements(hardware, f"gain:{kind}"):
            if r.get("graph") and isinstance(r.get("ratio"), (int, float)):
                by.setdefault(str(r["graph"]), []).append(float(r["ratio"]))
        return {g: _median(v) for g, v in by.items()}

    # -- a graph's eager step profile here (issue 18, session 29)
    def record_share(self, hardware: str, kind: str, share: float, graph: str) -> None:
        """Keep a share of ``graph``'s eager step measured here (``kind``: which, e.g. the time in
        GEMM-like kernels, ``_step_profile``), 0-1."""
        if not (0.0 <= share <= 1.0) or not graph:
            return
        data = self._load()
        rows = data.setdefault(self._key(hardware), {}).setdefault(f"share:{kind}", [])
        rows.append({"share": float(share), "at": time.time(), "graph": graph})
        del rows[:-KEEP]
        self._save(data)

    def shares(self, hardware: str, kind: str) -> dict[str, float]:
        """Every graph's median share of ``kind`` kept here (:meth:`record_share`), by graph."""
        by: dict[str, list[float]] = {}
        for r in self.measurements(hardware, f"share:{kind}"):
            if r.get("graph") and isinstance(r.get("share"), (int, float)):
                by.setdefault(str(r["graph"]), []).append(float(r["share"]))
        return {g: _median(v) for g, v in by.items()}

    # -- a graph's typical step here (issue 18, session 25)
    def record_step(self, hardware: str, kind: str, ms: float, graph: str, cpu: float = math.nan) -> None:
        """Keep a run's typical step of ``graph`` (``kind``: which step, e.g. the eager baseline's
        median over its trial): many steps' median, where a run's first step is one sample;
        ``cpu``: the same steps' thread CPU time, where known (the step alone, :meth:`step_ms`)."""
        if not (ms > 0 and math.isfinite(ms)) or not graph:
            return
        data = self._load()
        rows = data.setdefault(self._key(hardware), {}).setdefault(f"step:{kind}", [])
        row: dict[str, Any] = {"ms": float(ms), "at": time.time(), "graph": graph, "contention": contention()}
        if math.isfinite(cpu) and cpu > 0:
            row["cpu"] = float(cpu)
        rows.append(row)
        del rows[:-KEEP]
        self._save(data)

    def step_ms(self, hardware: str, kind: str, graph: str, slowdown: float | None = None) -> float | None:
        """The median typical step of ``graph`` the runs here kept (:meth:`record_step`), each
        scaled up to today's contention where that is higher than the one it was kept at, never
        down (a step under more runnable threads a core takes longer; one kept under a higher
        load average says little of what it takes alone, as a load's time, ``_at_load``);
        None: never kept.

        ``slowdown`` given (the caller's, at which it prices what the step is weighed against):
        a step that kept its CPU time is priced at what it took alone (its CPU time, at most its
        wall) times ``slowdown``, up or down (CPU time does not lag as the load average does);
        one that did not, as above (issue 18, session 26)."""
        now = contention()
        ms = []
        for r in self.measurements(hardware, f"step:{kind}"):
            if r.get("graph") != graph or not isinstance(r.get("ms"), (int, float)) or not r["ms"] > 0:
                continue
            cpu = r.get("cpu")
            if slowdown is not None and isinstance(cpu, (int, float)) and cpu > 0:
                ms.append(min(float(r["ms"]), float(cpu)) * max(1.0, slowdown))
                continue
            then = r.get("contention")
            scale = now / then if isinstance(then, (int, float)) and then > 0 else 1.0
            ms.append(float(r["ms"]) * max(1.0, scale))
        return _median(ms) if ms else None

    # -- how often a signal that a cache holds a graph was right (session of 2026-12-03 morning)
    def record_signal(self, hardware: str, kind: str, right: bool) -> None:
        """Keep the answer of one ask of ``kind`` that a signal read from the caches led to:
        ``right``, the caches held the graph (a hit)."""
        data = self._load()
        rows = data.setdefault(self._key(hardware), {}).setdefault(f"signal:{kind}", [])
        rows.append({"right": bool(right), "at": time.time()})
        del rows[:-KEEP]
        self._save(data)

    def signal_precision(self, hardware: str, kind: str, prior: tuple[float, float]) -> float:
        """The chance that the next signal of ``kind`` is right: the last ``KEEP`` answers kept
        here, counted with ``prior`` (right, wrong) as pseudo-answers (Laplace's rule)."""
        rows = self.measurements(hardware, f"signal:{kind}")
        right = sum(1 for r in rows if r.get("right"))
        return (right + prior[0]) / (len(rows) + prior[0] + prior[1])

    def first_price(self, hardware: str, kind: str, size: int) -> float | None:
        """A conservative price for the first compile of a graph never compiled here (issue 18,
        fourth session of 2026-12-02): ``size`` nodes on the reference curve
        (``compile_curve_ms``: a fixed part and a part per node) at the *highest* scale this
        host measured for ``kind`` (each compile's time over the curve at its size; compiles
        abandoned at their deadline count, their scale a lower bound), else for the other kinds
        of its family (``torch:whole:*``), at today's load; None (the caller's prior) where none
        was measured or the size is unknown. The highest, not the median: an underpriced compile
        is tried and can cost the run minutes (hf-t5: priced ~19 s, abandoned at its 57.6 s
        deadline after 151 s of exploration), an overpriced one only waits for a longer run or a
        cache hit. Until session 30 a scale per node (no fixed part): a small graph's compile,
        mostly its fixed part, priced every larger graph at its high rate per node."""
        if size <= 0:
            return None
        scale = self.compile_scale(hardware, kind)
        return None if scale is None else scale * compile_curve_ms(size)

    def compile_scale(self, hardware: str, kind: str) -> float | None:
        """The highest ratio of a cold compile's time (at today's load) to the reference curve at
        its size, over this host's compiles of ``kind``, else of its family; None: none here."""
        now = contention()
        family = kind.rsplit(":", 1)[0] + ":"
        by_kind = self._load().get(self._key(hardware), {})
        for kinds in ([kind], [k for k in by_kind if k != kind and k.startswith(family)]):
            scales: list[float] = [
                float(r["ms"]) / compile_curve_ms(int(r["size"]))
                for k in kinds
                for r in self._at_load(by_kind.get(k, []), now)
                if r.get("size", 0) > 0 and r.get("ms", 0) > 0 and not r.get("warm")
            ]
            if scales:
                return max(scales)
        return None

    # -- a cold compile priced by the ops of the step it compiles (issue 18, session 38)
    OP_FAMILY = "torch:whole:"

    def op_scale(self, hardware: str) -> float | None:
        """The highest ratio of a cold in-line whole-step compile's time here (at today's load)
        to the op curve (``op_curve_ms``) at its step's op count, over every such compile this
        host measured, whatever its graph and kind (``torch:whole:*``; compiles abandoned at
        their deadline count, their ratio a lower bound); None: none here kept its op count.
        The highest, as ``first_price``'s scale: an underpriced compile costs the run minutes."""
        now = contention()
        scales = [
            float(r["ms"]) / op_curve_ms(int(r["ops"]))
            for k, rows in self._load().get(self._key(hardware), {}).items()
            if k.startswith(self.OP_FAMILY)
            for r in self._at_load(rows, now)
            if r.get("ops", 0) > 0 and r.get("ms", 0) > 0 and not r.get("warm")
        ]
        return max(scales) if scales else None

    def op_price(self, hardware: str, ops: int) -> float | None:
        """A cold whole-step compile of a step of ``ops`` distinct ATen ops never compiled here, at the
        rate this host learned from its own compiles (``op_scale``; every graph's, so a second
        model's first compile is priced by the first's); None where the count is unknown or
        this host has measured none."""
        if ops <= 0:
            return None
        scale = self.op_scale(hardware)
        return None if scale is None else scale * op_curve_ms(ops)

    def op_prior(
        self,
        hardware: str,
        ops: int,
        first_in_process: bool | None = None,
        slowdown: float | None = None,
        speed: float | None = None,
    ) -> float | None:
        """The cold price of a whole-step compile of ``ops`` distinct ATen ops on a host that has measured
        none with an op count: the op curve at this host's speed (``host_speed``, or ``speed``),
        plus Inductor's first compile in this process where none ran yet, at ``slowdown``
        (default: today's contention), as ``size_prior`` prices FX nodes. None: count unknown."""
        if ops <= 0:
            return None
        first = (not inductor_compiled()) if first_in_process is None else first_in_process
        ms = op_curve_ms(ops) + (FIRST_IN_PROCESS_MS if first else 0.0)
        speed = self.host_speed(hardware) if speed is None else speed
        return ms * speed * (contention() if slowdown is None else slowdown)

    def known_speed(self, hardware: str, kind: str = SPEED_KIND) -> float | None:
        """This host's speed by the probe of ``kind`` where it was measured (``host_speed``);
        None: never measured here (nothing is measured by this call)."""
        rows = self.measurements(hardware, kind)
        return float(rows[-1]["ms"]) if rows else None

    def host_speed(
        self, hardware: str, kind: str = SPEED_KIND, measure: Callable[[], float] = measure_host_speed
    ) -> float:
        """This host's compile speed against the reference host's, by the probe ``measure`` of
        ``kind`` (default ``measure_host_speed``, FX; TensorFlow's: ``_tf_cost.measure_tf_speed``),
        measured once per host and kept in its record."""
        rows = self.measurements(hardware, kind)
        if rows:
            return float(rows[-1]["ms"])
        speed = measure()
        self.record(hardware, kind, speed)
        return speed

    def size_prior(
        self,
        hardware: str,
        size: int,
        first_in_process: bool | None = None,
        slowdown: float | None = None,
        speed: float | None = None,
    ) -> float | None:
        """The price of a cold whole-step compile of ``size`` FX nodes on a host that has measured
        no whole-step compile (issue 18, session 30; before, a flat 60 s whatever the graph): the
        reference curve at this host's speed, plus Inductor's first compile in this process
        where none ran yet (``first_in_process`` None: as this process stands), at the caller's
        ``slowdown`` (default: today's contention), at ``speed`` where given (default: this
        host's, ``host_speed``). None where the size is unknown."""
        if size <= 0:
            return None
        first = (not inductor_compiled()) if first_in_process is None else first_in_process
        ms = compile_curve_ms(size) + (FIRST_IN_PROCESS_MS if first else 0.0)
        speed = self.host_speed(hardware) if speed is None else speed
        return ms * speed * (contention() if slowdown is None else slowdown)

    def _other_kinds_estimate(self, hardware: str, kind: str, size: int) -> float | None:
        """A kind not compiled here yet, for a graph of known size: the per-node rate this host
        measured for the *other* kinds of the same framework (``torch:...``), times ``size``.
        Before any compile of the kind, the host's measured speed at compiling anything says
        more than a constant written in the code (the cold prior is the last resort: a host
        that has compiled nothing yet, or a graph of unknown size). Never for a size-less graph:
        a cell region's total says nothing about a whole step's."""
        if size <= 0:
            return None
        family = kind.split(":", 1)[0] + ":"
        now = contention()
        rates = [
            r["ms"] / r["size"]
            for k, rows in self._load().get(self._key(hardware), {}).items()
            if k != kind and k.startswith(family)
            for r in self._at_load(rows, now)
            if r.get("size", 0) > 0 and r.get("ms", 0) > 0 and not r.get("warm") and not r.get("floor")
        ]
        return _median(rates) * size if rates else None
