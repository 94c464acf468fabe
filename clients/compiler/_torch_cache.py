"""Will the whole-step compile hit Inductor's on-disk cache? Ask Inductor, without compiling.

``torch.compile`` of a recurrent model's training step costs seconds when Inductor's caches
(``TORCHINDUCTOR_CACHE_DIR``) already hold its graphs (an earlier run of this model on this
machine, by any job) and minutes when they do not. Priced at the cold cost, the whole-step
compile is pruned from runs that a cache hit would have repaid many times over (measured on
gru and sru: 0.57-0.80x of ``torch.compile`` per step without it); priced at the warm cost, a
cold compile stalls training for minutes. :class:`WholeStepBackend` is Inductor (``compile_fx``,
what ``torch.compile`` runs by default) with a *cache-only* mode: dynamo traces the step and
Inductor looks its graphs up, but generating code is refused, so a miss costs only the trace
(about a second) and leaves the graph eager, and a hit is the compile, done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import linecache
import math
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from . import _compile_costs
from ._deadline import DeadlineTimer
from ._rng import draws_random, faithful_random, random_name


class _Refused(Exception):
    """Inductor was about to generate code: the graph is not in its caches."""


class WholeStepBackend:
    """``torch.compile`` backend: Inductor, or in :attr:`cache_only` mode Inductor's cache alone.

    In cache-only mode a graph found in the caches is loaded and returned compiled; a graph
    Inductor would have to generate code for is returned as traced (eager), and :attr:`cold`
    counts it. :attr:`available` is False when this torch has no such hook (then every probe
    reports cold, and the caller keeps its cold price)."""

    def __init__(self, rewrite: bool = False, compiler: Any = None) -> None:
        self.cache_only = False
        self.cold = 0
        self.hits = 0
        self.available = _codegen_hook() is not None
        # ``rewrite``: the whole-step graph passes (hoisting, batching: :mod:`._torch_fx`) run on
        # dynamo's graph first; :attr:`rewrites` counts the products they changed.
        self.rewrite = rewrite
        self.rewrites = 0
        # ``count_offered`` (a plain step's cache ask, issue 18): also count, on a copy, the
        # products the passes *would* change in dynamo's graph, so that the one trace of the ask
        # tells whether the rewritten step is worth offering (no separate capture of the step).
        self.count_offered = False
        self.offered = 0
        self.compiler = compiler  # another backend than Inductor (tests); no cache to ask then
        self.nodes = 0  # FX nodes of the graphs dynamo handed over: the size a compile is priced by
        # The in-line compile's deadline (``_deadline``): its timer runs only inside the compile
        # calls below (each graph's), never while dynamo traces; None: no deadline.
        self.deadline: DeadlineTimer | None = None

    def __call__(self, gm: Any, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx

        self.nodes += len(gm.graph.nodes)
        if self.rewrite:
            from ._torch_fx import batch_shared_inputs, hoist_time_slices

            self.rewrites += hoist_time_slices(gm) + batch_shared_inputs(gm)
        elif self.count_offered:
            from ._torch_fx import count_rewrites

            with contextlib.suppress(Exception):  # a graph the passes cannot read offers nothing
                self.offered += count_rewrites(gm)
        if self.compiler is not None:
            from torch._dynamo import lookup_backend

            with self._bounded():
                return cast(Callable[..., Any], lookup_backend(self.compiler)(gm, list(example_inputs)))
        # A graph that draws random numbers draws eager's (``_rng``): set over the joint trace
        # here and over each graph's compile (the backward's is lazy: ``_inner``)
        faithful = draws_random(gm)
        if not self.cache_only:
            bounded = self.deadline is not None and self.deadline.budget_ms > 0
            if not faithful and not bounded:
                out = compile_fx(gm, list(example_inputs))
            else:
                inner = self._inner(faithful, bounded)
                with faithful_random(faithful):
                    out = compile_fx(gm, list(example_inputs), inner_compile=inner)
            _compile_costs.mark_inductor_compiled()  # (its first-compile cost is paid)
            return cast(Callable[..., Any], out)
        if not self.available:
            self.cold += 1
            return cast(Callable[..., Any], gm.forward)
        refused: list[bool] = []
        try:
            with _no_codegen(refused), faithful_random(faithful):
                compiled = compile_fx(
                    gm,
                    list(example_inputs),
                    **({"inner_compile": self._inner(True, False)} if faithful else {}),
                )
        except Exception:
            if not refused:
                raise  # a real failure, for the caller's guard to handle
            self.cold += 1
            return cast(Callable[..., Any], gm.forward)
        if refused:  # refused inside, then recovered by a fallback: not a cache hit
            self.cold += 1
            return cast(Callable[..., Any], gm.forward)
        self.hits += 1
        return cast(Callable[..., Any], compiled)

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[None]:
        """A compile call under the deadline the wrapper allowed (if any)."""
        if self.deadline is None:
            yield
            return
        with self.deadline.within():
            yield

    def _inner(self, faithful: bool = False, bounded: bool = True) -> Any:
        """Inductor's per-graph compile (``compile_fx_inner``), each call under the deadline the
        wrapper allows at that moment: the forward graph's in the backend's call, the backward
        graph's when AOTAutograd compiles it, lazily, at the step's first backward. The timer
        runs only there, never over Dynamo's trace or the user's code. (Not AOTAutograd's
        ``force_non_lazy_backward_lowering``: it is part of AOTAutograd's cache key, so the
        caches a plain ``torch.compile`` or an earlier run filled would no longer be found.)"""
        from torch._inductor.compile_fx import compile_fx_inner

        def inner(*args: Any, **kwargs: Any) -> Any:
            with self._bounded() if bounded else contextlib.nullcontext(), faithful_random(faithful):
                return compile_fx_inner(*args, **kwargs)

        return inner


def _codegen_hook() -> Any:
    try:
        import torch._inductor.compile_fx as cfx
    except Exception:  # noqa: BLE001 - no Inductor: nothing to probe
        return None
    return cfx if callable(getattr(cfx, "fx_codegen_and_compile", None)) else None


def _aot_cache() -> Any:
    try:
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    except Exception:  # noqa: BLE001 - older or newer torch: the code-generation hook alone
        return None
    return AOTAutogradCache if callable(getattr(AOTAutogradCache, "try_load", None)) else None


def _aot_bypasses() -> int:
    """How many graphs AOTAutograd's cache has bypassed in this process (its own counter)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - no counter: no bypass seen
        return 0
    return int(counters["aot_autograd"]["autograd_cache_bypass"])


def _has_field(obj: Any, name: str) -> bool:
    return dataclasses.is_dataclass(obj) and any(f.name == name for f in dataclasses.fields(obj))


@contextlib.contextmanager
def _no_codegen(refused: list[bool]) -> Iterator[None]:
    """Inductor's cache lookups run as usual; a miss raises :class:`_Refused`.

    Two places refuse. AOTAutograd's cache (forward and backward of the whole step, one entry)
    is asked first: its miss is refused there, before the joint graph is traced and partitioned
    (measured: a miss refused at code generation instead cost 9.5 s against 2.8 s for a hit,
    sru, 16 cell calls). Inductor's code generation refuses too, for a graph that AOTAutograd's
    cache does not cover. The two are patched process-wide for the one probe call: the training
    thread runs it between mini-batches, when nothing else in the job compiles."""
    cfx = _codegen_hook()
    real_codegen = cfx.fx_codegen_and_compile
    aot = _aot_cache()
    real_load = aot.__dict__["try_load"] if aot is not None else None

    def refuse(*args: Any, **kwargs: Any) -> Any:
        refused.append(True)
        raise _Refused()

    def load_or_refuse(*args: Any, **kwargs: Any) -> Any:
        assert real_load is not None  # only installed where the cache has try_load
        bypassed = _aot_bypasses()
        compiled_fn, aot_config = real_load.__func__(*args, **kwargs)
        if compiled_fn is None:
            if _aot_bypasses() > bypassed and _has_field(aot_config, "force_non_lazy_backward_lowering"):
                # AOTAutograd's cache cannot hold this graph (a bypass, not a miss: e.g. a
                # function dynamo kept as a call, einx's in x-transformers), so no program ever
                # left an entry for it here; Inductor's FX graph cache may hold its forward and
                # backward graphs all the same (issue 18, session 29: a torch.compile of
                # xt-encoder loaded both from there). Each is looked up below, and the backward
                # now, not lazily at the step's first backward, outside this refusal (the flag
                # is part of AOTAutograd's key only, which a bypass does not use).
                return None, dataclasses.replace(aot_config, force_non_lazy_backward_lowering=True)
            refused.append(True)
            raise _Refused()
        return compiled_fn, aot_config

    cfx.fx_codegen_and_compile = refuse
    if aot is not None:
        aot.try_load = staticmethod(load_or_refuse)
    try:
        yield
    finally:
        cfx.fx_codegen_and_compile = real_codegen
        if aot is not None:
            aot.try_load = real_load


# -- a cache warmed by another program (issue 18, session of 2026-12-03 morning) ----------------
#
# An ask (above) traces the step with dynamo before Inductor's caches can be looked up: seconds,
# more than 5% of a short run's eager time, so a run whose own record never asked for its graph
# never asks, and stays eager against a ``torch.compile`` that loads the same compile in about a
# second (Llama and DistilBERT at 5,000 steps: 1.48x and 1.32x). What such a compile leaves is
# readable without a trace: the FX graph cache's entry of its forward graph
# (``fxgraph/<2>/<key>/<entry>``, which an AOTAutograd entry names where that cache holds the
# graph, and which is kept where it bypasses it) holds Inductor's generated code in plain text: ``assert_size_stride(primals_<i>, (shape), (stride), 'input')``
# for every graph input (the parameters and the step's inputs, in that graph) and, from dynamo,
# ``# File: <source file>:<line> in <function>, code: <the line>`` for the code it traced. A
# model whose parameters' and inputs' shapes are all among one forward graph's inputs, and whose
# own source files appear in that graph's comments with the same code at the same lines, was
# compiled here, whole, by some program: the signal (``warm_signal``). Nothing is unpickled: the
# entries are read as bytes.

_ASSERT = re.compile(rb"assert_size_stride\((primals_\d+), \(([\d, ]*)\), \([\d, ]*\), 'input'\)")
_FILE = re.compile(rb"# File: ([^\n:]+):(\d+) in \w+, code: ([^\n]*)")
_FORWARD = re.compile(rb"# AOT ID: \['\d+_forward'\]")
_VERSION = re.compile(rb"# torch version: ([^\s]+)")
_THREADS = re.compile(rb"cpp_runtime_thread_count: (\d+)")  # (in the key's details kept in the entry)
# Inductor's ``fallback_random`` in the key's details, and the random operators of the graph's
# code: Inductor's own random stream (its prims, what it lowers a random operator to without
# ``fallback_random``) and ATen's random operators (kept as calls with it). ``_rng``.
_FALLBACK = re.compile(rb"inductor_config\[fallback_random\]: (True|False)")
_OWN_RANDOM = re.compile(rb"prims\.inductor_(?:random|randint|seeds|lookup_seed)\b")
_ATEN_OP = re.compile(rb"torch\.ops\.aten\.(\w+)\.")
# What an index row was read by: a row read by an older reader lacks what this one reads (the
# key's ``fallback_random`` and the graph's random operators: version 2), and is read again.
_READ_VERSION = 2
# The lines kept per source file of a graph, to check against the file as it is now.
_LINES_KEPT = 8


@dataclass(frozen=True)
class CompiledStep:
    """What one compiled forward graph in Inductor's caches shows without a trace: its input
    shapes (``primals``, e.g. ``"4,32"``; ``""`` a scalar), the source lines dynamo traced
    (file -> up to ``_LINES_KEPT`` (line, code) pairs), the torch it was compiled by and the
    intra-op thread count in its cache key (0: not shown), Inductor's ``fallback_random`` in its
    key (None: not shown) and whether its graph draws random numbers (by either route)."""

    shapes: tuple[str, ...]
    lines: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    torch_version: str = ""
    threads: int = 0
    fallback_random: bool | None = None
    draws: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "shapes": list(self.shapes),
            "lines": self.lines,
            "torch": self.torch_version,
            "threads": self.threads,
            "fallback_random": self.fallback_random,
            "draws": self.draws,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> CompiledStep:
        lines = {f: [(int(n), str(c)) for n, c in v] for f, v in dict(d.get("lines", {})).items()}
        shapes = tuple(str(s) for s in d.get("shapes", []))
        fallback = d.get("fallback_random")
        return CompiledStep(
            shapes,
            lines,
            str(d.get("torch", "")),
            int(d.get("threads", 0)),
            fallback if isinstance(fallback, bool) else None,
            bool(d.get("draws", False)),
        )

    def found_by_microco(self) -> bool:
        """Would microco's compile of this graph use this entry's key as far as random numbers
        go? It compiles a graph that draws with ``fallback_random`` (``_rng``) and any other with
        Inductor's setting as it is; the setting is part of the key. An entry a plain
        ``torch.compile`` left of a graph that draws (Inductor's own random stream) is one microco
        never loads (issue 18, session 30: GPT-2 at its default dropout, compiled by
        ``torch.compile``: read as warm, asked in 5.6 s, cold)."""
        if self.fallback_random is None:
            return True  # (not shown: not ruled out)
        from torch._inductor import config

        return self.fallback_random == (self.draws or bool(config.fallback_random))


def _shape(dims: bytes | tuple[int, ...]) -> str:
    if isinstance(dims, bytes):
        return ",".join(p.strip().decode() for p in dims.split(b",") if p.strip())
    return ",".join(str(int(d)) for d in dims)


def read_forward_entry(data: bytes) -> CompiledStep | None:
    """The forward graph an FX graph cache entry holds (None: a backward or inference graph)."""
    if not _FORWARD.search(data):
        return None
    shapes = tuple(_shape(m.group(2)) for m in _ASSERT.finditer(data))
    if not shapes:
        return None
    lines: dict[str, list[tuple[int, str]]] = {}
    seen: set[tuple[str, int]] = set()
    for m in _FILE.finditer(data):
        path, line = m.group(1).decode(errors="replace"), int(m.group(2))
        kept = lines.setdefault(path, [])
        if (path, line) in seen or len(kept) >= _LINES_KEPT:
            continue
        seen.add((path, line))
        kept.append((line, m.group(3).decode(errors="replace").strip()))
    version, threads, fallback = _VERSION.search(data), _THREADS.search(data), _FALLBACK.search(data)
    return CompiledStep(
        shapes,
        lines,
        version.group(1).decode() if version else "",
        int(threads.group(1)) if threads else 0,
        fallback.group(1) == b"True" if fallback else None,
        _draws(data),
    )


def _draws(data: bytes) -> bool:
    """Does the graph an entry holds draw random numbers: Inductor's own random prims, or an ATen
    random operator called as it is (``_rng``'s names; not a backward, nor ``normalize``)?"""
    if _OWN_RANDOM.search(data):
        return True
    return any(
        random_name(name) and not name.endswith("_backward")
        for name in {m.decode(errors="replace").lower() for m in _ATEN_OP.findall(data)}
    )


def inductor_cache_dir() -> Path | None:
    """Inductor's cache directory here (``TORCHINDUCTOR_CACHE_DIR`` or its default)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except Exception:  # noqa: BLE001 - no Inductor: no cache to read
        return None
    return Path(cache_dir())


class CompiledSteps:
    """The forward graphs Inductor's FX graph cache in ``root`` holds (whether or not an
    AOTAutograd entry names them), each read once: an index kept in ``index`` (a JSON file, by
    entry path, size and modification time) makes a later scan a listing of the directory."""

    def __init__(self, root: Path, index: Path | None = None) -> None:
        self.root = root
        self.index = index
        self.read = 0  # entries read this scan (not found in the index)
        self.truncated = False  # entries left unread this scan (its budget spent)

    def _load_index(self) -> dict[str, Any]:
        if self.index is None:
            return {}
        try:
            data = json.loads(self.index.read_text())
        except (OSError, ValueError):
            return {}
        mine = data.get(str(self.root)) if isinstance(data, dict) else None
        return mine if isinstance(mine, dict) else {}

    def _save_index(self, mine: dict[str, Any]) -> None:
        if self.index is None:
            return
        try:
            try:
                data = json.loads(self.index.read_text())
            except (OSError, ValueError):
                data = {}
            if not isinstance(data, dict):
                data = {}
            data[str(self.root)] = mine
            self.index.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.index.parent, prefix=".inductor_steps.")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.index)
        except OSError:
            pass  # not kept: the next scan reads the entries again

    def scan(self, budget_ms: float = math.inf) -> list[CompiledStep]:
        """The compiled steps the caches hold. Entries not in the index are read newest first,
        and only while ``budget_ms`` lasts (a large cache is read over several runs, never more
        than the caller can pay in one: :attr:`truncated` says some were left)."""
        # The FX graph cache's entries (``fxgraph/<2>/<key>/<entry>``), not only those an
        # AOTAutograd entry names: a graph AOTAutograd's cache bypasses (x-transformers' steps,
        # which call einx) has no AOTAutograd entry, while its forward and backward FX graphs are
        # kept and an ask loads them (``_no_codegen``; issue 18, session 29: read through
        # AOTAutograd entries alone, xt-encoder and xt-tied read as surely never compiled here,
        # and were not asked, while torch.compile loaded both graphs of each in 7-29 s).
        fx = self.root / "fxgraph"
        try:
            entries = [
                e
                for d in fx.iterdir()
                if d.is_dir()
                for k in d.iterdir()
                if k.is_dir()
                for e in k.iterdir()
                if e.is_file()
            ]
        except OSError:
            return []
        stamped = []
        for e in entries:
            try:
                st = e.stat()
            except OSError:
                continue
            stamped.append((st.st_mtime_ns, st.st_size, e))
        stamped.sort(key=lambda t: t[0], reverse=True)
        known, now, out = self._load_index(), {}, []
        self.read, self.truncated = 0, False
        started = time.perf_counter()
        for mtime, size, e in stamped:
            stamp = [size, mtime, _READ_VERSION]
            row = known.get(str(e))
            if not (isinstance(row, dict) and row.get("stamp") == stamp):
                if (time.perf_counter() - started) * 1e3 >= budget_ms:
                    self.truncated = True
                    continue
                try:
                    step = read_forward_entry(e.read_bytes())
                except OSError:
                    continue
                self.read += 1
                row = {"stamp": stamp, "step": step.to_json() if step is not None else None}
            now[str(e)] = row
            if row.get("step"):
                out.append(CompiledStep.from_json(row["step"]))
        if now != known:
            self._save_index(now)
        return out


def model_inputs_shapes(model: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Counter[str]:
    """The shapes a whole-step graph of ``model`` called on ``args``/``kwargs`` takes as inputs,
    whatever else it takes: every parameter (tied ones once) and every tensor argument (one passed
    twice once, as dynamo lifts it)."""
    import torch

    from ._torch_fx import flatten_args

    shapes: Counter[str] = Counter(_shape(tuple(p.shape)) for p in model.parameters())
    seen: set[int] = set()
    for a in flatten_args(tuple(args) + tuple(kwargs.values())):
        if isinstance(a, torch.Tensor) and id(a) not in seen:
            seen.add(id(a))
            shapes[_shape(tuple(a.shape))] += 1
    return shapes


def model_source_files(model: Any) -> set[str]:
    """The source files of the classes of ``model``'s modules (torch's own layers included)."""
    files: set[str] = set()
    for cls in {type(m) for m in model.modules()}:
        with contextlib.suppress(TypeError, OSError):
            f = inspect.getsourcefile(cls)
            if f:
                files.add(os.path.realpath(f))
    return files


def matches(step: CompiledStep, shapes: Counter[str], extra: int, files: set[str]) -> bool:
    """Is ``step`` the whole step of a model with these input ``shapes`` (plus at most ``extra``
    lifted buffers) and module source ``files``? Compiled by this torch, every one of the shapes
    among its inputs, some of the files traced, the code it traced from them still there, and
    keyed by this process's thread count."""
    import torch

    if step.torch_version and step.torch_version != torch.__version__:
        return False
    if step.threads and step.threads != torch.get_num_threads():
        return False  # another key: Inductor's CPU code is keyed by the thread count
    if not step.found_by_microco():
        return False  # another key: random numbers drawn by another route (``_rng``)
    have = Counter(step.shapes)
    if any(have[s] < n for s, n in shapes.items()) or len(step.shapes) > sum(shapes.values()) + extra:
        return False
    # Files by name, not path: the key holds neither, and the same code compiled from another
    # checkout is the same graph (measured: torch-transformer, compiled from another worktree,
    # asked and hit). The code it traced is still in the file, wherever (an edit elsewhere that
    # moved the lines keeps the cache's answer).
    by_name: dict[str, list[str]] = {}
    for f in files:
        by_name.setdefault(os.path.basename(f), []).append(f)
    mine = [
        (code, by_name[os.path.basename(f)])
        for f, traced in step.lines.items()
        if os.path.basename(f) in by_name
        for _, code in traced
    ]
    if not mine:
        return False
    return all(any(code in _code_lines(f) for f in candidates) for code, candidates in mine)


def _code_lines(path: str) -> set[str]:
    linecache.checkcache(path)
    return {line.strip() for line in linecache.getlines(path)}


def warm_signal(model: Any, args: Sequence[Any], kwargs: dict[str, Any], **where: Any) -> bool:
    """Does Inductor's cache here hold a compile of ``model``'s whole step (see above)? ``where``:
    :func:`read_signal`'s ``root``, ``index`` and ``budget_ms`` (entries not read within it count
    as not holding it, :meth:`CompiledSteps.scan`)."""
    return read_signal(model, args, kwargs, **where)[0]


def read_signal(
    model: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    root: Path | None = None,
    index: Path | None = None,
    budget_ms: float = math.inf,
) -> tuple[bool, bool]:
    """(the signal, whether the caches surely hold no compile of ``model``): :func:`warm_signal`,
    and whether its "no" is certain: every entry was read within ``budget_ms`` and none traced a
    line of any of the model's source files (by name, torch's own layers' included). A "no" of the
    signal alone is not: a step dynamo split into several graphs matches no one graph's inputs."""
    root = root if root is not None else inductor_cache_dir()
    if root is None:
        return False, False
    scanner = CompiledSteps(root, index)
    steps = scanner.scan(budget_ms)
    complete = not scanner.truncated
    if not steps:
        return False, complete
    shapes = model_inputs_shapes(model, args, kwargs)
    extra = sum(1 for _ in model.buffers())
    files = model_source_files(model)
    if any(matches(s, shapes, extra, files) for s in steps):
        return True, False
    names = {os.path.basename(f) for f in files}
    related = any(os.path.basename(f) in names for s in steps for f in s.lines)
    return False, complete and not related
