"""Trace model names the performance model has not measured: refused unless mapped.

A job whose model the performance model has no measurement of would run at made-up speeds
(a 100 ms mini-batch, a fully busy device, packed pairs at 0.5): on one trace that moved
gandiva's utilisation from 0.735 to 0.849. So the simulator refuses such a trace, naming the
models, unless the user says what to do: map a name onto a measured one (``model_map``,
``--model-map NAME=KNOWN`` or ``--model-map-file``), or accept default speeds for every
unknown name (``on_unknown_model="default"``, ``--unknown-models default``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

UNKNOWN_MODEL_CHOICES = ("error", "default")


class UnknownModelError(ValueError):
    """Trace models the performance model has not measured, with no mapping for them."""

    def __init__(self, unknown: list[str], known: Iterable[str]) -> None:
        self.unknown = list(unknown)
        self.known = sorted(known)
        shown = ", ".join(repr(m) for m in self.unknown[:10]) + (" ..." if len(self.unknown) > 10 else "")
        super().__init__(
            f"the performance model has no measurement of {len(self.unknown)} trace model(s): {shown}; "
            "map each onto a measured one (--model-map NAME=KNOWN, repeatable, or --model-map-file FILE) "
            "or run them at default speeds (--unknown-models default). Measured models: "
            + ", ".join(self.known)
        )


def parse_model_map_item(text: str) -> tuple[str, str]:
    """``NAME=KNOWN`` -> (NAME, KNOWN); ValueError on anything else. The split is at the last
    ``=`` so a name may contain one; both sides are stripped."""
    name, sep, known = text.rpartition("=")
    name, known = name.strip(), known.strip()
    if not sep or not name or not known:
        raise ValueError(f"expected NAME=KNOWN, got {text!r}")
    return name, known


def read_model_map(path: str | os.PathLike) -> dict[str, str]:
    """A mapping file: a JSON object ``{"NAME": "KNOWN", ...}``, or lines ``NAME=KNOWN``
    (blank lines and ``#`` comments skipped). ValueError naming the file (and line)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read model map {p}: {exc.strerror}") from None
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{p}: not valid JSON ({exc})") from None
        if not all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in raw.items()):
            raise ValueError(f"{p}: expected a JSON object of model name -> measured model name")
        return dict(raw)
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            k, v = parse_model_map_item(line)
        except ValueError as exc:
            raise ValueError(f"{p}:{n}: {exc}") from None
        out[k] = v
    return out


def check_model_map(mapping: Mapping[str, str], known: set[str]) -> None:
    """Every mapping target must be a measured model (when the model measures any)."""
    if not known:
        return
    bad = sorted({v for v in mapping.values() if v not in known})
    if bad:
        raise ValueError(
            f"model map target(s) {', '.join(map(repr, bad))} not measured by the performance model; "
            "measured models: " + ", ".join(sorted(known))
        )
