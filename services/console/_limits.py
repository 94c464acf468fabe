"""Bounds on what the console accepts and returns (issue 16, "bounded inputs").

* a request arrives whole within ``REQUEST_TIMEOUT_S`` of its connection's opening or its last
  answer, else the connection is closed (``timely_protocol``);
* a request body is at most ``MAX_BODY_BYTES`` (413 with a short message, checked on the
  declared length and again on the bytes as they arrive, so a chunked body cannot go round it);
* a validation error (422) never echoes unbounded input: each offending value is cut to a
  short preview and at most ``MAX_ERRORS`` errors are listed;
* list endpoints return pages (``limit``, default ``DEFAULT_PAGE``, at most ``MAX_PAGE``) with an
  opaque ``next_cursor``; a store query's JSON is at most ``MAX_QUERY_DEPTH`` levels deep and
  ``MAX_QUERY_NODES`` values in all.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from microco.common.errors import InvalidArgument

MAX_BODY_BYTES = 1024 * 1024  # 1 MiB: a job spec or a query, never data
# A connection's next request must arrive whole (headers and body) this soon after the
# connection opens or its last answer; else it is closed (uvicorn waited for ever: session 41)
REQUEST_TIMEOUT_S = 10.0
MAX_ERRORS = 10  # validation errors listed in one 422
PREVIEW_CHARS = 80  # of an offending value, in a 422
DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_CURSOR = 512
MAX_QUERY_DEPTH = 32
MAX_QUERY_NODES = 10_000
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _too_large_body(limit: int) -> bytes:
    return json.dumps(
        {"error": "PayloadTooLarge", "message": f"request body is larger than {limit} bytes"}
    ).encode()


class BodyLimit:
    """ASGI middleware: refuse a body over ``limit`` bytes with 413 before the app reads it whole."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def _refuse(self, send: Any) -> None:
        body = _too_large_body(self.limit)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers") or []:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.limit + 1
                if declared > self.limit:
                    await self._refuse(send)
                    return
        if any(name == b"content-length" for name, _ in scope.get("headers") or []):
            # The HTTP server delivers no more than the declared length.
            await self.app(scope, receive, send)
            return
        # No declared length (chunked): read up to the limit here, then hand the body on. An
        # exception raised from inside the app's receive would reach FastAPI wrapped (400).
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return whole
            return await receive()

        await self.app(scope, replay, send)


def _preview(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=True, default=repr)
        except (TypeError, ValueError, RecursionError):
            text = repr(type(value))
    if len(text) <= PREVIEW_CHARS:
        return text if isinstance(value, str) else value
    return f"{text[:PREVIEW_CHARS]}... ({len(text)} characters)"


def _short(item: Any) -> Any:
    if isinstance(item, str) and len(item) > PREVIEW_CHARS:
        return f"{item[:PREVIEW_CHARS]}... ({len(item)} characters)"
    return item


def bounded_errors(errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's errors, each value cut to a preview, at most ``MAX_ERRORS`` of them (plus one
    entry saying how many more there were)."""
    out: list[dict[str, Any]] = []
    for e in errors[:MAX_ERRORS]:
        item: dict[str, Any] = {
            "type": str(e.get("type", "")),
            "loc": [_short(x) if isinstance(x, str) else x for x in e.get("loc", ())][:12],
            "msg": _short(str(e.get("msg", ""))),
        }
        if "input" in e:
            item["input"] = _preview(e["input"])
        out.append(item)
    if len(errors) > MAX_ERRORS:
        out.append(
            {"type": "more_errors", "loc": [], "msg": f"{len(errors) - MAX_ERRORS} more errors not listed"}
        )
    return out


def check_query_shape(query: Any) -> Any:
    """A store query is JSON at most ``MAX_QUERY_DEPTH`` deep with ``MAX_QUERY_NODES`` values."""
    count = 0
    stack: list[tuple[Any, int]] = [(query, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_QUERY_NODES:
            raise ValueError(f"the query has more than {MAX_QUERY_NODES} values")
        if depth > MAX_QUERY_DEPTH:
            raise ValueError(f"the query is nested more than {MAX_QUERY_DEPTH} levels deep")
        if isinstance(node, dict):
            for k, v in node.items():
                if len(k) > 1000:
                    raise ValueError("a key of the query is longer than 1000 characters")
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str) and len(node) > 65536:
            raise ValueError("a string in the query is longer than 65536 characters")
    return query


# --------------------------------------------------------------------------- pagination

T = TypeVar("T")


def _encode(key: Sequence[Any]) -> str:
    return (
        base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode().rstrip("=")
    )


def _decode(cursor: str) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(
            "the cursor is not one this console issued (pass next_cursor as given)"
        ) from exc
    if not isinstance(key, list):
        raise InvalidArgument("the cursor is not one this console issued (pass next_cursor as given)")
    return key


def paginate(
    items: Iterable[T], key: Callable[[T], Sequence[Any]], limit: int, cursor: str
) -> tuple[list[T], str]:
    """Items in ``key`` order after ``cursor`` (keyset: stable while items come and go), at most
    ``limit`` of them, and the cursor of the next page ("" on the last)."""
    ordered = sorted(items, key=lambda it: tuple(key(it)))
    if cursor:
        after = _decode(cursor)
        try:
            ordered = [it for it in ordered if list(key(it)) > after]
        except TypeError as exc:
            raise InvalidArgument(
                "the cursor is not one this console issued (pass next_cursor as given)"
            ) from exc
    page = ordered[:limit]
    nxt = _encode(key(page[-1])) if len(ordered) > limit else ""
    return page, nxt


def timely_protocol(timeout_s: float = REQUEST_TIMEOUT_S) -> type[Any]:
    """uvicorn's HTTP protocol, closing a connection whose request has not arrived whole
    ``timeout_s`` after the connection opened or its last answer was sent.

    uvicorn closes a kept-alive connection that sends nothing for 5 s, but waits for a request's
    headers and body for ever once a byte of them came (or, on a new connection, before any
    did): each such connection holds a file descriptor, and the console's port is the one a
    deployment publishes (session 41's held-out round). A request whose answer takes longer is
    not cut: the timer looks only at requests still arriving."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class _Timely(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _request_timer: Any = None

        def connection_made(self, transport: Any, *args: Any, **kwargs: Any) -> None:
            super().connection_made(transport, *args, **kwargs)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
            self._request_timer = self.loop.call_later(timeout_s, self._late)

        def _late(self) -> None:
            self._request_timer = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.more_body:
                return  # a whole request, being answered: the next one is timed from its answer
            if not self.transport.is_closing():
                self.transport.close()

    return _Timely
