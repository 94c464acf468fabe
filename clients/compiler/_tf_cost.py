"""What an XLA compile will cost, priced from the graph XLA will compile.

The exploration core prunes a compiled choice whose compile cannot be repaid within the run, so
the price it is handed matters both ways: session 2 priced whole-step XLA at 1.5 s per cell call
(24 s for 16 time steps) and was wrong both ways (sru compiled in 7.5 s and was never tried;
milstm and lnlstm compiled for 67-171 s and lost). Here a choice's price is the number of HLO
instructions of the module XLA would compile (``experimental_get_compiler_ir(...)(stage="hlo")``
lowers the traced step to HLO without compiling code) times a per-instruction rate: a cold prior
measured on the development machine, replaced by the median of the rates measured on this
hardware as compiles happen (kept on disk per hardware id, so the next job, any model, starts from
the measured rate). A module of a class (its opcodes, ``hlo_class``) this hardware never compiled
is priced, where the run affords it, by a calibration: a small step of that class compiled once
(``calibrate``), its rate kept until the class's own compiles are measured (issue 18, session 28).
Per exploration key the core calibrates further on its own (its measured
compile costs against the priors handed to it), and a choice's own measured cost replaces its
prior outright.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _compile_costs

# Cold prior (ms per HLO instruction: trace + lowering + XLA CPU compile of a training step),
# measured on the shared 2-core development machine, zoo cells at sequence 16, batch 16, input
# 32, hidden 64: 2.8 (sru, load 1.4) to 8.8 (lstm, load 5.5) ms per instruction for both the
# unrolled and the while-loop step. The middle of that range, chosen a priori, not fitted to the
# benchmark; measured rates replace it as soon as a compile on this hardware has been timed.
COLD_MS_PER_INSTRUCTION = 5.0

# How a cold XLA compile of a training step (its first call: trace, lowering and CPU compile)
# grows with its module: a fixed part and a part per HLO instruction (issue 18, session 31).
# Measured on reference graphs, not on any corpus model: Keras residual stacks of Dense, GELU and
# LayerNorm blocks (654-18,200 instructions), of 3x3 convolutions (235-1,599), and a raw
# ``tf.while_loop`` over 16 time steps with 2-24 products in its body (456-3,536), each the first
# compile in a fresh process, by the process's CPU time; 28 compiles, 14:32-14:42 UTC 2026-12-04
# on the 2-core VM (TensorFlow 2.21 CPU, loads 1.2-5.1): least squares 503 ms + 0.283 ms an
# instruction, each compile within 0.72-1.37x of it (docs/benchmarks/compiler.md, session 31).
# Its scale is this host's speed (``measure_tf_speed``). Where a host has a speed it replaces
# the flat cold prior (``COLD_MS_PER_INSTRUCTION``, 5 ms an instruction: 5-19x those compiles).
# Held out (Keras' own GRU, MultiHeadAttention blocks, a custom RNN cell): 1.2-2.1x the curve
# (the cold prior: 3.0-4.1x over them); ``keras.applications.MobileNetV3Small`` (convolution):
# 3.9-4.5x the curve. Convolutions' compile time follows more than their instruction count (the
# small convolution references fit the curve), so a module with convolutions is not priced on
# it (``CURVE_EXCLUDES``): the cold prior (3.3-3.8x over MobileNet's) or a calibration prices it.
XLA_FIXED_MS = 500.0
XLA_INSTRUCTION_MS = 0.28
CURVE_EXCLUDES = frozenset({"convolution"})


def xla_curve_ms(instructions: int) -> float:
    """The reference shape of a cold XLA compile of ``instructions`` HLO instructions (ms, at the
    reference host's speed: scale 1)."""
    return XLA_FIXED_MS + XLA_INSTRUCTION_MS * max(0, instructions)


# The host-speed probe for TensorFlow (a TF process need not import torch, whose FX probe
# ``_compile_costs.measure_host_speed`` is): CPU time (ms, median) of tracing a small reference
# step into a graph, the Python graph building that is much of a step's first call. Measured on
# the reference host of ``xla_curve_ms`` (this 2-core VM), after a process's first trace.
# 5.9-6.9 ms a trace (reps 2-5, 8 readings, ~14:48 UTC 2026-12-04, load 2-3), 0.9x of what the
# same probe read with autograph on beside the curve's compiles (6.35-7.62 ms, 14:42-14:43).
TF_SPEED_REFERENCE_MS = 6.2
TF_SPEED_KIND = "speed:tf-trace"


def measure_tf_speed(reps: int = 3) -> float:
    """This host's speed at tracing against the reference host's (above 1: slower), from the CPU
    time of ``reps`` traces of a reference step (a first one, a warm-up, dropped); 25-55 ms
    in a process that has traced before. CPU time, not wall: the load is the caller's
    contention, not speed. Never below ``_compile_costs.SPEED_FLOOR``."""
    import tensorflow as tf

    ws = [tf.ones((8, 8)) for _ in range(8)]
    spec = tf.TensorSpec((4, 8), tf.float32)
    times = []
    for _ in range(reps + 1):

        def ref(h: Any) -> Any:
            for w in ws:
                h = tf.tanh(tf.matmul(h, w)) + h
            return tf.reduce_mean(h)

        c0 = time.process_time()
        tf.function(ref, autograph=False).get_concrete_function(spec)
        times.append((time.process_time() - c0) * 1e3)
    return max(_compile_costs.SPEED_FLOOR, statistics.median(times[1:]) / TF_SPEED_REFERENCE_MS)


# A measured rate (compile ms / instruction) counts only within these bounds: a sample far
# outside means the timing was disturbed (a step stalled by another process), not a rate.
_RATE_BOUNDS = (0.05, 200.0)
_KEEP = 16  # latest samples kept per hardware id
_KEEP_SIZES = 256  # models whose module sizes are remembered per hardware id
_RATES_KEY = "ms_per_instruction_alone"  # rates as if alone on the machine (see ``observe``)
# The same from compiles timed by the process's CPU time over an in-line compile (``observe(
# cpu_ms=)``): a compile's own work, on every thread, whatever else ran on the machine. Preferred
# where present (session of 2026-12-03 morning): the wall time divided by the load average of
# compiles run in the background beside the training priced keras-sublstm's XLA at 0.44-2.4 s
# alone (median 1.0 s). Not the compiling thread's CPU: XLA ran 0.44 of its 1.56 s of CPU there.
_CPU_RATES_KEY = "ms_per_instruction_cpu"
_CPU_GRAPHS_KEY = "graph_cpu_ms"
# Rates from this host's calibration compiles (``calibrate``), per bucket: a small XLA step of a
# class's opcodes, compiled once where no compile of that class was measured here (issue 18,
# session 28). Used only until a compile of the class itself is measured.
_CALIBRATED_KEY = "calibrated_ms_per_instruction"
# How many cores an in-line XLA compile kept busy here: its process CPU time over its wall time
# alone (the wall divided by the contention it ran at), between 1 and the host's cores (issue
# 18, session 34). XLA compiles on several threads (keras-sublstm's step on this 2-core VM:
# 805-828 ms of wall for 1,251-1,276 ms of CPU, 1.5-1.6 cores), so a price in CPU time is not
# what a compile in the training step costs the run: its wall is the CPU time over this.
_PARALLEL_KEY = "inline_parallelism"


def hlo_instruction_count(hlo_text: str) -> int:
    """Instructions in an HLO module's text: one ``%name = ...`` line each, in every computation
    (while-loop bodies count once: they are compiled once, whatever the trip count)."""
    n = 0
    for line in hlo_text.splitlines():
        s = line.lstrip()
        if s.startswith(("%", "ROOT ")) and " = " in s and not s.endswith("{"):
            n += 1
    return n


# Opcodes whose presence sets a module's *class* for pricing (session 11): XLA's compile time per
# instruction is a property of what the module does, not only of its size. Found in the corpus: a
# rate measured on recurrent cells (dots and while loops) priced MobileNetV3Small's step
# (convolutions), which then compiled for 360-835 s at load 20-28. Rates are kept per class; a
# module of a class this hardware never compiled is priced by a calibration compile of the class
# (``calibrate``) or the cold prior, not by another class's measured rate.
_CLASS_OPCODES = (
    "convolution",
    "dot",
    "while",
    "reduce-window",
    "select-and-scatter",
    "sort",
    "scatter",
    "gather",
)
_OPCODE = re.compile(r"\b(" + "|".join(re.escape(o) for o in _CLASS_OPCODES) + r")\(")


def hlo_class(hlo_text: str) -> str:
    """The module's class: the class-setting opcodes it contains, sorted and joined by ``+``
    (``"elementwise"`` when it has none)."""
    found = sorted(set(_OPCODE.findall(hlo_text)))
    return "+".join(found) or "elementwise"


def step_hlo_profile(fn: Any, *args: Any) -> tuple[int, str]:
    """(instructions, class) of ``fn``'s XLA module on ``args`` (see :func:`step_hlo_instructions`)."""
    text = fn.experimental_get_compiler_ir(*args)(stage="hlo")
    return hlo_instruction_count(text), hlo_class(text)


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
    return unrolled_hlo_profile(fn, x, y)[0]


def unrolled_hlo_profile(fn: Any, x: Any, y: Any) -> tuple[int, str]:
    """(instructions, class) of the unrolled step (see :func:`unrolled_hlo_instructions`)."""
    steps = int(x.shape[0])
    if steps <= 2:
        return step_hlo_profile(fn, x, y)
    one, cls = step_hlo_profile(fn, x[:1], y)
    two, _ = step_hlo_profile(fn, x[:2], y)
    return one + (steps - 1) * (two - one), cls


# The calibration step's depth (matmul layers): ~220-430 HLO instructions whatever the class;
# measured on this 2-core machine (load ~11, 2026-12-04) at 0.45 s for a ``dot+gather+scatter``
# step of 226 instructions, against 1.0 s for one of 778 (a fixed ~0.2 s per compile and ~1 ms
# an instruction): small, so that its compile is cheap, and its rate per instruction, which
# carries the fixed part, errs high for a model's larger module rather than low.
CALIBRATION_DEPTH = 8


def calibration_step(op_class: str, depth: int = CALIBRATION_DEPTH) -> tuple[Any, tuple[Any, ...]]:
    """A small training step (a loss and its gradient) under ``tf.function(jit_compile=True)``
    whose XLA module has the opcodes of ``op_class`` (:func:`hlo_class`): ``depth`` matmuls (or
    products) with ``tanh``, an embedding lookup (``gather``; its gradient, ``scatter``), a while
    loop, a convolution and a pooling (``reduce-window``; max pooling's gradient,
    ``select-and-scatter``), a sort, as the class names them; and the arguments to call it on.
    Its class is not checked here (:func:`calibrate` does)."""
    import tensorflow as tf

    ops = set(op_class.split("+")) - {"elementwise"}
    width, batch = 16, 8
    rng = tf.random.Generator.from_seed(0)
    params = [rng.normal((width, width)) * 0.1 for _ in range(depth)]
    params.append(rng.normal((4 * width, width)) * 0.1)  # an embedding table
    params.append(rng.normal((3, 3, 2, 2)) * 0.1)  # a convolution's kernel
    x = rng.normal((batch, width))
    ids = tf.constant([i % (4 * width) for i in range(batch)], tf.int32)
    image = rng.normal((1, 8, 8, 2))

    @tf.function(jit_compile=True)  # type: ignore[untyped-decorator]
    def step(params: list[Any], x: Any, ids: Any, image: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(params)
            h = x
            if "gather" in ops:
                table = params[depth] if "scatter" in ops else tf.stop_gradient(params[depth])
                h = h + tf.gather(table, ids)
            elif "scatter" in ops:
                rows = tf.reshape(ids % batch, (-1, 1))
                h = tf.tensor_scatter_nd_add(h, rows, h * params[depth][:batch])
            for i in range(depth):
                h = tf.matmul(h, params[i]) if "dot" in ops else h * params[i][0]
                h = tf.tanh(h) + 0.5 * h
            if "while" in ops:
                h = tf.while_loop(
                    lambda i, s: i < 3,
                    lambda i, s: (i + 1, tf.tanh(s) * params[0][0]),
                    (0, h),
                    maximum_iterations=3,
                )[1]
            loss = tf.reduce_mean(h * h)
            if ops & {"convolution", "reduce-window", "select-and-scatter"}:
                img = image
                if "convolution" in ops:
                    img = tf.nn.conv2d(img, params[depth + 1], 1, "SAME")
                if "select-and-scatter" in ops:
                    img = tf.nn.max_pool2d(img, 2, 2, "VALID")
                elif "reduce-window" in ops:
                    img = tf.nn.avg_pool2d(img, 2, 2, "VALID")
                loss = loss + tf.reduce_mean(img * img)
            if "sort" in ops:
                loss = loss + tf.reduce_mean(tf.sort(tf.stop_gradient(h), axis=-1)[:, :1])
        grads = tape.gradient(loss, params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return loss, [tf.convert_to_tensor(g) for g in grads]

    return step, (params, x, ids, image)


def calibrate(op_class: str, depth: int = CALIBRATION_DEPTH) -> tuple[int, float, float] | None:
    """Compile :func:`calibration_step` of ``op_class`` once and time it: (HLO instructions,
    compile ms of wall, compile ms of the process's CPU), each the first call (trace, lowering,
    compile, run) less the second (a run); None where the step's module is not of that class
    (a class this builder cannot make: the caller keeps its prior) or a time is not positive."""
    fn, args = calibration_step(op_class, depth)
    text = fn.experimental_get_compiler_ir(*args)(stage="hlo")
    if hlo_class(text) != op_class:
        return None
    n = hlo_instruction_count(text)
    t0, c0 = time.perf_counter(), time.process_time()
    fn(*args)[0].numpy()
    t1, c1 = time.perf_counter(), time.process_time()
    fn(*args)[0].numpy()
    t2, c2 = time.perf_counter(), time.process_time()
    ms, cpu = ((t1 - t0) - (t2 - t1)) * 1e3, ((c1 - c0) - (c2 - c1)) * 1e3
    return (n, ms, cpu) if n > 0 and ms > 0 else None


# TensorFlow ops that lower to no HLO instruction of their own (values, reads, renames)
_FREE_OPS = frozenset(
    {
        "Const",
        "Identity",
        "IdentityN",
        "NoOp",
        "Placeholder",
        "ReadVariableOp",
        "StopGradient",
        "_Arg",
        "_Retval",
    }
)


def graph_ops(concrete: Any) -> int:
    """The computing ops of a traced step (a concrete function) and of the functions it calls
    (a loop's bodies): each lowers to at least one HLO instruction, so XLA's module of the step
    is no smaller (keras-sublstm: 146 ops, a module of 708 instructions). Read in about a
    millisecond from the trace the step already made, against a count of the module itself
    (a second trace and a lowering: 168 ms)."""
    gd = concrete.graph.as_graph_def()
    ops = sum(1 for n in gd.node if n.op not in _FREE_OPS)
    return ops + sum(1 for f in gd.library.function for n in f.node_def if n.op not in _FREE_OPS)


# Attributes of an op that change what it computes (its element type, a convolution's or a
# pooling's window, a product's transposes); the others name things (a called function's name
# carries a number that differs from process to process) or repeat shapes.
_KIND_ATTRS = frozenset(
    {
        "T",
        "dtype",
        "SrcT",
        "DstT",
        "Tidx",
        "strides",
        "padding",
        "dilations",
        "ksize",
        "data_format",
        "transpose_a",
        "transpose_b",
        "adj_x",
        "adj_y",
        "epsilon",
        "is_training",
        "approximate",
    }
)


def graph_kinds(concrete: Any) -> str:
    """What a traced step computes, without its names: a digest of its ops' kinds (type and the
    attributes that change what an op computes, ``_KIND_ATTRS``) and how many of each, over its
    graph and the functions it calls. The same program traced again (in another process, its
    layers named otherwise) reads the same; a model of the same weights' shapes computing
    otherwise (a ``LayerNormalization`` for a ``BatchNormalization``, another activation, loss,
    optimiser or dtype) reads another."""
    gd = concrete.graph.as_graph_def()
    nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
    counts: Counter[str] = Counter()
    for n in nodes:
        attrs = ",".join(
            f"{k}={n.attr[k].SerializeToString(deterministic=True).hex()}"
            for k in sorted(n.attr)
            if k in _KIND_ATTRS
        )
        counts[f"{n.op}({attrs})"] += 1
    text = ";".join(f"{k}*{v}" for k, v in sorted(counts.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
        self,
        hardware: str,
        path: Path | str | None = None,
        cold_rate: float = COLD_MS_PER_INSTRUCTION,
        speed: Callable[[], float] | None = None,
    ):
        self.hardware = hardware
        self.path = Path(path) if path is not None else None
        self.cold_rate = cold_rate
        # This host's speed (``measure_tf_speed``, measured once and kept by the caller): given, a
        # module of a class never compiled or calibrated here is priced on ``xla_curve_ms`` at
        # it, not at ``cold_rate`` an instruction (issue 18, session 31).
        self.speed = speed
        self._samples: dict[str, list[float]] = {}
        # HLO sizes of the XLA modules of models seen on this host (see ``module_sizes``).
        self._sizes: dict[str, dict[str, int]] = {}
        # Per graph (a model's structure and input shapes: the key of ``module_sizes``), per kind:
        # the compiles of that very module measured here (ms alone on the machine), and a lower
        # bound where one was abandoned at its deadline (``observe_abandoned``).
        self._graphs: dict[str, dict[str, list[float]]] = {}
        self._floors: dict[str, dict[str, float]] = {}
        self._classes: dict[str, dict[str, str]] = {}
        # The same two, from compiles timed by the process's CPU time (preferred; see observe).
        self._cpu_samples: dict[str, list[float]] = {}
        self._cpu_graphs: dict[str, dict[str, list[float]]] = {}
        self._calibrated: dict[str, list[float]] = {}
        self._parallel: dict[str, list[float]] = {}  # one bucket, "xla": see ``parallelism``
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
        self._samples = _parse_samples(mine, _RATES_KEY)
        self._cpu_samples = _parse_samples(mine, _CPU_RATES_KEY)
        self._calibrated = _parse_samples(mine, _CALIBRATED_KEY)
        self._parallel = _parse_samples(mine, _PARALLEL_KEY)
        self._sizes = _parse_sizes(mine.get("module_sizes") if isinstance(mine, dict) else None)
        self._graphs = _parse_graphs(mine, "graph_ms_alone")
        self._cpu_graphs = _parse_graphs(mine, _CPU_GRAPHS_KEY)
        raw = mine.get("module_classes", {}) if isinstance(mine, dict) else {}
        self._classes = {
            str(g): {str(k): str(v) for k, v in kinds.items() if isinstance(v, str)}
            for g, kinds in (raw.items() if isinstance(raw, dict) else ())
            if isinstance(kinds, dict)
        }
        raw = mine.get("graph_floor_ms_alone", {}) if isinstance(mine, dict) else {}
        self._floors = {
            str(g): {str(k): float(v) for k, v in kinds.items() if isinstance(v, (int, float))}
            for g, kinds in (raw.items() if isinstance(raw, dict) else ())
            if isinstance(kinds, dict)
        }

    def module_sizes(self, key: str) -> dict[str, int] | None:
        """The HLO instruction counts remembered for ``key`` (a model's structure and input
        shapes), if a run on this host counted them: the next run skips the traces (measured
        about 3.5 s of a TF job's first step at sequence 8)."""
        got = self._sizes.get(key)
        return dict(got) if got else None

    def remember_module_sizes(
        self, key: str, sizes: dict[str, int], classes: dict[str, str] | None = None
    ) -> None:
        self._sizes.pop(key, None)  # re-inserted last: the most recent
        self._sizes[key] = {k: int(n) for k, n in sizes.items()}
        if classes:
            self._classes.pop(key, None)
            self._classes[key] = {k: str(c) for k, c in classes.items()}
        self._save()

    def module_classes(self, key: str) -> dict[str, str]:
        """The classes (:func:`hlo_class`) of ``key``'s XLA modules, where a run counted them."""
        return dict(self._classes.get(key, {}))

    def samples(self, kind: str = "loop", op_class: str = "") -> list[float]:
        b = _bucket(kind, op_class)
        return list(self._cpu_samples.get(b) or self._samples.get(b, []))

    def rate(self, kind: str = "loop", op_class: str = "") -> float:
        """ms per HLO instruction for modules of ``kind`` (and of ``op_class``, see
        :func:`hlo_class`, where given: rates are not borrowed across classes): the median
        measured rate, scaled from the load each was measured at to the load now
        (``_compile_costs.contention``), else the cold prior, scaled the same way."""
        return self._rate_alone(kind, op_class) * _compile_costs.contention()

    def _rate_alone(self, kind: str, op_class: str) -> float:
        got = self.samples(kind, op_class) or self._calibrated.get(_bucket(kind, op_class), [])
        # The cold prior too: it was measured with the 2 cores nearly to itself (load 1.4-5.5).
        return statistics.median(got) if got else self.cold_rate

    def _cold_ms(self, instructions: int, op_class: str = "") -> float:
        """A cold compile (alone) of a module of ``instructions`` of a class with no rate here: on
        the size curve at this host's speed where it has one and the class is one the curve
        prices (``CURVE_EXCLUDES``), else at the cold prior's rate."""
        if self.speed is not None and not CURVE_EXCLUDES & set(op_class.split("+")):
            return xla_curve_ms(instructions) * self.speed()
        return max(1, instructions) * self.cold_rate

    def _known_rate(self, kind: str, op_class: str) -> float | None:
        got = self.samples(kind, op_class) or self._calibrated.get(_bucket(kind, op_class), [])
        return statistics.median(got) if got else None

    def least_ms(self, instructions: int, kind: str, speed: float | None = None) -> float:
        """The least this host prices (alone) a ``kind`` module of at least ``instructions``
        instructions, whatever its class: at its lowest measured or calibrated rate of the kind,
        and cold, on the size curve at ``speed`` where this model has a speed (the caller's: the
        host's where already measured; else the reference host's, 1, so that this gate, which
        only decides whether a module is counted, never pays the probe: 30-80 ms, 3-6% of
        keras-sublstm's 1,000-step run), else at the cold prior's rate."""
        rates = [
            statistics.median(v)
            for store in (self._cpu_samples, self._samples, self._calibrated)
            for b, v in store.items()
            if v and (b == kind or b.startswith(f"{kind}|"))
        ]
        measured = min(rates) * max(1, instructions) if rates else math.inf
        if self.speed is None:
            return min(measured, max(1, instructions) * self.cold_rate)
        return min(measured, xla_curve_ms(instructions) * (1.0 if speed is None else speed))

    def least_rate(self, kind: str) -> float:
        """The lowest ms per instruction (alone) this host prices a ``kind`` module of any class
        at: its measured and calibrated rates, and the cold prior (what a class never measured is
        priced at). What a module whose class is not yet known cannot be priced below, unless a
        calibration of its class is made."""
        rates = [
            statistics.median(v)
            for store in (self._cpu_samples, self._samples, self._calibrated)
            for b, v in store.items()
            if v and (b == kind or b.startswith(f"{kind}|"))
        ]
        return min([self.cold_rate, *rates])

    def has_rate(self, kind: str, op_class: str) -> bool:
        """Was a rate of ``kind`` and ``op_class`` measured here, by its compiles or by a
        calibration (:meth:`observe_calibration`)? False: it is priced at the cold prior."""
        b = _bucket(kind, op_class)
        return bool(self.samples(kind, op_class) or self._calibrated.get(b))

    def observe_calibration(
        self, instructions: int, compile_ms: float, kind: str, op_class: str, cpu_ms: float | None = None
    ) -> bool:
        """Record a calibration compile (:func:`calibrate`) of ``op_class`` as the rate of
        ``kind`` modules of that class, used until a compile of the class itself is measured
        (``observe``); by its CPU time where given (its work alone), else its wall over the
        load. ``False`` where the rate is out of bounds (a disturbed timing)."""
        if instructions <= 0 or not compile_ms > 0 or not op_class:
            return False
        alone = cpu_ms if cpu_ms is not None and cpu_ms > 0 else compile_ms / _compile_costs.contention()
        r = alone / instructions
        if not _RATE_BOUNDS[0] <= r <= _RATE_BOUNDS[1]:
            return False
        b = _bucket(kind, op_class)
        self._calibrated[b] = (self._calibrated.get(b, []) + [r])[-_KEEP:]
        self._save()
        return True

    def estimate(
        self,
        instructions: int,
        kind: str = "loop",
        graph: str = "",
        op_class: str = "",
        at_load: bool = True,
    ) -> float:
        """Expected compile time (ms) of a ``kind`` module of ``instructions`` HLO instructions:
        what compiles of this very ``graph`` measured here (median), else the rate of its class;
        never below what an abandoned compile of the graph was seen to exceed. Scaled to the
        load now; ``at_load=False``: the compile alone on the machine, its work (what a compile
        in the background can take from the training beside it, see ``AstraTF.variables``).
        At the load, a price measured in CPU time (the graph's own compiles, a class's rate, the
        cold curve's) is the wall time of that work on the cores an in-line compile kept busy
        here (``parallelism``)."""
        c = _compile_costs.contention() if at_load else 1.0
        own, by_cpu = self._own_measured(graph, kind)
        if own:
            alone = statistics.median(own)
        else:
            b = _bucket(kind, op_class)
            by_cpu = not (self._samples.get(b) and not self._cpu_samples.get(b))
            rate = self._known_rate(kind, op_class)
            alone = max(1, instructions) * rate if rate is not None else self._cold_ms(instructions, op_class)
        ms = alone * c / (self.parallelism() if at_load and by_cpu else 1.0)
        floor = self._floors.get(graph, {}).get(kind) if graph else None
        return max(ms, floor * c) if floor else ms

    def _own_measured(self, graph: str, kind: str) -> tuple[list[float] | None, bool]:
        """This graph's measured compiles of ``kind`` (ms alone): by CPU time where any was
        (then True), else wall times over the load they ran at (False)."""
        if not graph:
            return None, True
        cpu = self._cpu_graphs.get(graph, {}).get(kind)
        return (cpu, True) if cpu else (self._graphs.get(graph, {}).get(kind), False)

    def _own(self, graph: str, kind: str) -> list[float] | None:
        """This graph's measured compiles of ``kind`` (ms alone): by CPU time where any was."""
        return self._own_measured(graph, kind)[0]

    def parallelism(self) -> float:
        """The cores an in-line XLA compile kept busy on this host (the median of those
        measured, ``observe``), 1 until one was measured."""
        got = self._parallel.get("xla")
        return statistics.median(got) if got else 1.0

    def compiled_here(self, graph: str, kind: str) -> bool:
        """Has a compile of this graph's ``kind`` module finished here (not only been abandoned)?"""
        return bool(self._own(graph, kind))

    def measured(self, graph: str, kind: str) -> bool:
        """Has a compile of this graph's ``kind`` module been measured (or abandoned) here?"""
        return bool(self._own(graph, kind)) or kind in self._floors.get(graph, {})

    def observe(
        self,
        instructions: int,
        compile_ms: float,
        kind: str = "loop",
        graph: str = "",
        op_class: str = "",
        cpu_ms: float | None = None,
    ) -> bool:
        """Record a measured compile (ms of wall at today's load) of a ``kind`` module of
        ``instructions`` instructions (of ``graph``, of ``op_class``); ``False`` if the sample
        was discarded as out of bounds. ``cpu_ms``: the process's CPU time over the compile (in
        line, nothing else running in the process), its work alone whatever else ran on the
        machine, kept apart and preferred to the wall time divided by the load average."""
        if instructions <= 0 or not compile_ms > 0:
            return False
        r = compile_ms / instructions
        if not _RATE_BOUNDS[0] <= r <= _RATE_BOUNDS[1]:
            return False
        if cpu_ms is not None and cpu_ms > 0 and _RATE_BOUNDS[0] <= cpu_ms / instructions:
            samples, graphs, alone = self._cpu_samples, self._cpu_graphs, cpu_ms
            cores = float(os.cpu_count() or 1)
            p = min(cores, max(1.0, cpu_ms * _compile_costs.contention() / compile_ms))
            self._parallel["xla"] = (self._parallel.get("xla", []) + [p])[-_KEEP:]
        else:
            samples, graphs, alone = self._samples, self._graphs, compile_ms / _compile_costs.contention()
        b = _bucket(kind, op_class)
        samples[b] = (samples.get(b, []) + [alone / instructions])[-_KEEP:]
        if graph:
            mine = graphs.setdefault(graph, {})
            mine[kind] = (mine.get(kind, []) + [alone])[-_KEEP:]
            self._floors.get(graph, {}).pop(kind, None)  # measured: a lower bound says no more
        self._save()
        return True

    def observe_abandoned(self, graph: str, kind: str, elapsed_ms: float) -> None:
        """A compile of ``graph``'s ``kind`` module was abandoned after ``elapsed_ms`` without
        finishing: it costs at least that (at today's load). Kept as the graph's lower bound, so
        the next run prices it at no less, and no rate is learned from it (it is censored)."""
        if not graph or not elapsed_ms > 0:
            return
        alone = elapsed_ms / _compile_costs.contention()
        mine = self._floors.setdefault(graph, {})
        mine[kind] = max(mine.get(kind, 0.0), alone)
        self._save()

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
                graphs = _merge_graphs(old, "graph_ms_alone", self._graphs)
                self._cpu_graphs = _merge_graphs(old, _CPU_GRAPHS_KEY, self._cpu_graphs)
                floors = _merge_graphs(old, "graph_floor_ms_alone", self._floors)
                classes = _merge_graphs(old, "module_classes", self._classes)
                self._graphs, self._floors, self._classes = graphs, floors, classes
                data[self.hardware] = {
                    _RATES_KEY: self._samples,
                    _CPU_RATES_KEY: self._cpu_samples,
                    _CALIBRATED_KEY: self._calibrated,
                    _PARALLEL_KEY: self._parallel,
                    _CPU_GRAPHS_KEY: self._cpu_graphs,
                    "module_sizes": sizes,
                    "graph_ms_alone": graphs,
                    "graph_floor_ms_alone": floors,
                    "module_classes": classes,
                }
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(data, indent=1))
                tmp.replace(self.path)
            except OSError:
                pass  # the rate is an optimisation: a read-only home must not stop training


def _bucket(kind: str, op_class: str) -> str:
    return f"{kind}|{op_class}" if op_class else kind


def _parse_samples(mine: Any, field: str) -> dict[str, list[float]]:
    """Rates per bucket as stored (the latest ``_KEEP``); malformed ones left out."""
    raw = mine.get(field, {}) if isinstance(mine, dict) else {}
    return {
        str(k): [float(r) for r in v if isinstance(r, (int, float))][-_KEEP:]
        for k, v in (raw.items() if isinstance(raw, dict) else ())
        if isinstance(v, list)
    }


def _parse_graphs(mine: Any, field: str) -> dict[str, dict[str, list[float]]]:
    """Per graph, per kind, the latest measured compiles (ms) as stored; malformed ones left out."""
    raw = mine.get(field, {}) if isinstance(mine, dict) else {}
    return {
        str(g): {
            str(k): [float(x) for x in v if isinstance(x, (int, float))][-_KEEP:]
            for k, v in kinds.items()
            if isinstance(v, list)
        }
        for g, kinds in (raw.items() if isinstance(raw, dict) else ())
        if isinstance(kinds, dict)
    }


def _merge_graphs(old: Any, field: str, mine: dict[str, Any]) -> dict[str, Any]:
    """Another process's per-graph entries, then this one's (its latest last), bounded."""
    theirs = old.get(field) if isinstance(old, dict) else None
    theirs = theirs if isinstance(theirs, dict) else {}
    merged = {k: v for k, v in theirs.items() if k not in mine and isinstance(v, dict)} | mine
    while len(merged) > _KEEP_SIZES:
        merged.pop(next(iter(merged)))
    return merged
