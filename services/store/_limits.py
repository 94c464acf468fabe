"""Bounds on what a request may carry, and the one check that turns a name from a request into a path.

Every limit is enforced where a request enters (the coordinator's RPCs, a node's Flight tickets and
actions) and refused with ``InvalidArgument`` naming the limit; error text quotes request values only
through ``short`` so an oversized id is never echoed whole."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from microco.common.errors import InvalidArgument

MAX_QUERY_BYTES = 1 << 20  # a query's JSON or SQL text
MAX_DEPTH = 32  # nesting of JSON objects/lists in a query or ticket
MAX_SQL_DEPTH = 200  # nesting of a SQL expression tree
MAX_SQL_BYTES = 256 << 10  # a SQL text
MAX_SQL_LIST = 10_000  # values of one IN list, items of one SELECT list in SQL
MAX_NAME = 256  # table, column, extent and output names
MAX_ITEMS = 10_000  # filters, columns, aggregates, order keys
MAX_IN_VALUES = 100_000  # values of one IN list
MAX_LIMIT = 1 << 62

_NAME = re.compile(r"^[\w-][\w.-]*$")  # the catalog's table names (letters, digits, _ -) and extent files


def short(value: Any, n: int = 64) -> str:
    """``repr(value)`` cut to about ``n`` characters (for error messages)."""
    text = repr(value)
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} chars)"


def json_depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of ``obj`` (iterative, so it cannot overflow the stack); stops past ``limit``."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list, tuple)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            items = o.values() if isinstance(o, dict) else o
            stack.extend((x, d + 1) for x in items)
    return deepest


def _text_depth_slow(text: str, limit: int) -> int:
    """``_text_depth`` character by character in Python (the reference its tests compare with;
    ~1 s a 5 MB ticket on a loaded node, paid by every fragment before it started)."""
    depth = deepest = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


# a JSON string (escapes included), or an unterminated one running to the end of the text
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _text_depth(text: str, limit: int) -> int:
    """Bracket nesting of JSON text, counted before parsing (json.loads recurses per level):
    strings cut out and the brackets' running depth summed, in C (regular expressions, numpy),
    not a Python loop over every character of a ticket."""
    if "[" not in text and "{" not in text:
        return 0
    skeleton = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).encode()
    if not skeleton:
        return 0
    b = np.frombuffer(skeleton, dtype=np.uint8)
    step = np.where((b == ord("[")) | (b == ord("{")), 1, -1).astype(np.int64)
    deepest = int(np.cumsum(step).max())
    return max(deepest, 0)


def load_json(
    text: str | bytes, what: str, max_bytes: int = MAX_QUERY_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """Parse request JSON within the size and nesting limits, or raise ``InvalidArgument``."""
    if len(text) > max_bytes:
        raise InvalidArgument(f"{what} is {len(text)} bytes; the limit is {max_bytes}")
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError:
            raise InvalidArgument(f"{what} is not UTF-8") from None
    if _text_depth(text, max_depth) > max_depth:
        raise InvalidArgument(f"{what} is nested more than {max_depth} levels deep")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidArgument(f"{what} is not valid JSON: {short(str(exc), 120)}") from None


def check_keys(d: dict[str, Any], allowed: set[str] | frozenset[str], what: str) -> None:
    """Refuse keys a request does not define (a misspelt ``wehre`` must not be silently ignored)."""
    unknown = [k for k in d if k not in allowed]
    if unknown:
        raise InvalidArgument(
            f"{what}: unknown field {short(unknown[0])}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + f"; the fields are {', '.join(sorted(allowed))}"
        )


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} must be a string, got {type(name).__name__}")
    if not name or len(name) > MAX_NAME:
        raise InvalidArgument(f"{what} must be 1 to {MAX_NAME} characters, got {len(name)}")
    return name


def check_count(items: Any, what: str, limit: int = MAX_ITEMS) -> None:
    if len(items) > limit:
        raise InvalidArgument(f"{what}: {len(items)} items; the limit is {limit}")


def safe_path(root: str | Path, *names: str) -> Path:
    """``root/names[0]/names[1]/...`` for names taken from a request, or ``InvalidArgument``.

    Each name must be one plain path component (letters, digits, ``_ . -``; not ``.`` or ``..``,
    no separator, not absolute, bounded length), and the joined path must still lie under
    ``root`` once resolved (so a symlink inside the data directory cannot lead out of it either)."""
    base = Path(root).resolve()
    p = base
    for n in names:
        if not isinstance(n, str) or not n or len(n) > MAX_NAME or not _NAME.match(n) or n in (".", ".."):
            raise InvalidArgument(
                f"bad name {short(n)}: letters, digits, '_', '.', '-' only, one path component"
            )
        p = p / n
    resolved = p.resolve()
    if resolved != base and base not in resolved.parents:
        raise InvalidArgument(f"path {short(str(p))} leaves the data directory")
    return p
