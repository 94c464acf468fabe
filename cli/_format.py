"""How the CLI shows values to people: one formatter for every table cell, one table printer.

Numbers: integers as they are; floats rounded for reading (``6331.549999999999`` ->
``6331.55``, ``0.000123456`` -> ``0.000123``), never in exponent form below 1e15; a missing
value as ``-``; lists joined with commas. Counts a table knows to be counts (rows, extents)
get thousands separators (``count``: ``200,000``), byte counts binary units (``size``);
identifiers that happen to be numbers (a pid, a trip id) are left as they are. Columns of
numbers are right-aligned so their digits line up. ``--json`` output is never formatted
(machines get every digit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def number(v: float) -> str:
    """A number for people: two decimals at most from 1 up, three significant digits below,
    trailing zeros dropped (``3.0`` -> ``3``, ``12.50`` -> ``12.5``)."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if abs(v) >= 1e15:
        return f"{v:.3g}"
    if abs(v) >= 1:
        text = f"{v:.2f}"
    else:
        digits = 2 - math.floor(math.log10(abs(v)))  # three significant digits
        text = f"{v:.{digits}f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text in ("-0", "") else text


def count(n: float | None) -> str:
    """A count for people: ``200000`` -> ``200,000`` (a float is rounded as ``number`` does)."""
    if n is None or isinstance(n, bool):
        return cell(n)
    if isinstance(n, int) or (isinstance(n, float) and n.is_integer() and abs(n) < 1e15):
        return f"{int(n):,}"
    text = number(n)
    whole, dot, frac = text.partition(".")
    return f"{int(whole):,}{dot}{frac}" if whole.lstrip("-").isdigit() else text


def size(n: float | None) -> str:
    """Bytes for people (binary units): ``1536`` -> ``1.5 KiB``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)  # not reached


def cell(v: Any) -> str:
    """Any table cell as text (see the module doc)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return number(v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={cell(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple, set)):
        return ",".join(cell(x) for x in v) or "-"
    return str(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def print_table(
    rows: Sequence[dict[str, Any]],
    cols: Iterable[str] | None = None,
    *,
    upper: bool = True,
    formats: dict[str, Callable[[Any], str]] | None = None,
    right: Iterable[str] = (),
) -> None:
    """Rows as aligned columns under a header (column names upper-cased unless ``upper=False``).

    ``formats`` names a formatter per column (``count``, ``size``); other cells go through
    ``cell``. Columns of numbers (and those in ``right``) are right-aligned."""
    if not rows and cols is None:
        return
    names = list(cols) if cols is not None else list(rows[0])
    formats = formats or {}
    text = [[formats.get(c, cell)(r.get(c)) if c in r else "" for c in names] for r in rows]
    heads = [c.upper() if upper else c for c in names]
    widths = [max([len(h)] + [len(t[i]) for t in text]) for i, h in enumerate(heads)]
    numeric = set(right) | {
        c
        for c in names
        if any(_is_number(r.get(c)) for r in rows)
        and all(r.get(c) is None or _is_number(r.get(c)) for r in rows)
    }
    aligned = [(str.rjust if c in numeric else str.ljust) for c in names]  # the header follows its column

    def line(cells: list[str]) -> str:
        return "  ".join(a(x, w) for a, x, w in zip(aligned, cells, widths, strict=True)).rstrip()

    print(line(heads))
    for t in text:
        print(line(t))
