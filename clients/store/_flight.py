"""The store's one Flight client path, shared by the SDK (``StoreClient.read``), the coordinator's
transport to the store nodes and a node's reads from its peers: one ``FlightClient`` per address,
reused (a connection costs more than a small read on a loaded machine), ``do_get`` of a ticket
into an Arrow table, and Flight errors turned back into the microco errors the server raised
(the server sends ``FlightServerError("<Type>: message")``)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from microco.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    MicrocoError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from microco.common.identity import Identity

from ._flight_tls import flight_client

ERRORS: dict[str, type[MicrocoError]] = {
    "NotFound": NotFound,
    "InvalidArgument": InvalidArgument,
    "FailedPrecondition": FailedPrecondition,
    "ResourceExhausted": ResourceExhausted,  # a node's full disk (session 40)
}

OPTIONS = flight.FlightCallOptions(timeout=120)
# A stream read batch by batch as its reader consumes it (``do_get_stream``) may be held while
# the reader takes other streams first: its deadline is the whole query's, not one read's.
STREAM_OPTIONS = flight.FlightCallOptions(timeout=3600)


def from_flight_error(
    exc: BaseException, where: str, errors: dict[str, type[MicrocoError]] | None = None
) -> MicrocoError:
    """The microco error a Flight error stands for (``errors``: more server error types by name)."""
    if isinstance(
        exc,
        (
            flight.FlightUnavailableError,
            flight.FlightTimedOutError,
            flight.FlightCancelledError,
            ConnectionError,
        ),
    ):  # (cancelled: by ``abort``, the peer gone, or by the server going down)
        return Unavailable(f"{where}: {exc}")
    text = str(exc)
    for name, cls in {**(errors or {}), **ERRORS}.items():
        marker = f"{name}: "
        if marker in text:
            msg = text.split(marker, 1)[1].split("\n")[0]
            msg = msg.split(". Detail:")[0]
            return cls(msg)
    if "failed to connect" in text.lower() or "unavailable" in text.lower() or "Connection refused" in text:
        return Unavailable(f"{where}: {text}")
    return MicrocoError(f"{where}: {text}")


class FlightClients:
    """One Flight client per peer address, reused; ``get`` is where clients are made."""

    def __init__(
        self, errors: dict[str, type[MicrocoError]] | None = None, ident: Identity | None = None
    ) -> None:
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        # the readers being read, by address (``abort`` cancels them)
        self._reading: dict[str, set[Any]] = {}
        self.errors = errors or {}
        self.ident = ident  # whom this side calls as (None: the process's own identity; TLS unless insecure)

    def get(self, address: str) -> flight.FlightClient:
        with self._lock:
            c = self._clients.get(address)
            if c is None:
                c = flight_client(address, self.ident)
                self._clients[address] = c
            return c

    def drop(self, address: str) -> None:
        with self._lock:
            c = self._clients.pop(address, None)
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110 - closing: a dead connection is not an error
                pass

    def close(self) -> None:
        for a in list(self._clients):
            self.drop(a)

    def abort(self, address: str) -> None:
        """Cancel every read in progress from ``address`` (its server left the cluster: one that
        stopped answering without a reset would hold them to their deadline); the readers raise
        ``Unavailable``. A call still waiting for its first message has no reader yet and is not
        reached (pyarrow's Flight client cannot cancel it)."""
        with self._lock:
            readers = list(self._reading.get(address, ()))
        for r in readers:
            try:
                r.cancel()
            except Exception:  # noqa: BLE001, S110 - a reader that has just finished
                pass

    @contextlib.contextmanager
    def _read(self, address: str, reader: Any) -> Iterator[Any]:
        with self._lock:
            self._reading.setdefault(address, set()).add(reader)
        try:
            yield reader
        finally:
            with self._lock:
                held = self._reading.get(address)
                if held is not None:
                    held.discard(reader)
                    if not held:
                        del self._reading[address]

    def do_get(self, address: str, ticket: bytes | dict[str, Any]) -> pa.Table:
        """The table a ticket (raw bytes, or a JSON object) reads from the server at ``address``."""
        raw = ticket if isinstance(ticket, bytes) else json.dumps(ticket, default=str).encode()
        try:
            reader = self.get(address).do_get(flight.Ticket(raw), OPTIONS)
            with self._read(address, reader):
                # a batch at a time, not ``read_all``: a ``read_all`` cancelled by ``abort``
                # raises KeyboardInterrupt in the main thread (pyarrow 26 takes the cancellation
                # for Ctrl-C); ``read_chunk`` raises FlightCancelledError in the reading thread
                batches = [chunk.data for chunk in reader if chunk.data is not None]
                return pa.Table.from_batches(batches, schema=reader.schema)
        except flight.FlightError as exc:
            if isinstance(exc, flight.FlightUnavailableError):
                self.drop(address)
            raise from_flight_error(exc, address, self.errors) from None

    def do_get_stream(
        self, address: str, ticket: bytes | dict[str, Any]
    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """The stream a ticket reads, not gathered into a table: its schema (once the server has
        answered: a task has run), then its record batches as they are consumed (one at a time in
        memory). Errors, at the start or half-way, are the microco errors ``do_get`` raises."""
        raw = ticket if isinstance(ticket, bytes) else json.dumps(ticket, default=str).encode()
        try:
            reader = self.get(address).do_get(flight.Ticket(raw), STREAM_OPTIONS)
            schema = reader.schema
        except flight.FlightError as exc:
            if isinstance(exc, flight.FlightUnavailableError):
                self.drop(address)
            raise from_flight_error(exc, address, self.errors) from None

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                with self._read(address, reader):
                    for chunk in reader:
                        if chunk.data is not None:
                            yield chunk.data
            except flight.FlightError as exc:
                if isinstance(exc, flight.FlightUnavailableError):
                    self.drop(address)
                raise from_flight_error(exc, address, self.errors) from None
            finally:
                reader.cancel()  # no-op once read to the end; frees the call when abandoned

        return schema, batches()
