"""A store table as a Quiver dataset: its extents are the cache's chunks, content-addressed.

``StoreTable`` is a read-only backing store over one Instalytics table, read through Arrow
Flight straight from the store nodes that hold it. A store node's ``GetFlightInfo`` gives one
endpoint per extent of one replica (``replica``: the one whose partitioning suits the job, e.g.
partitioned by a label or a shard key; a lost extent is served as buckets of another replica,
one endpoint each). Each endpoint is one *file* of the dataset: its rows as an Arrow IPC
stream (``columns`` projected), so ``index_store_table`` makes each extent one sample and one
chunk, named by the BLAKE3 digest of those bytes like any other dataset's, and the cache
serves them to every job that reads the table, on any host, without a second scan of the
store. ``decode_sample`` turns a sample back into its rows.

An extent is immutable (appends write new ones), so its bytes, and so its digest, are the same
at every read; a table that grew needs a new index, as a directory that grew does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ._index import DatasetIndex, build_index


class StoreTable:
    """Read-only ``BackingStore`` over a store table (see the module's doc).

    ``node`` is any store node's Flight address (``grpc://host:port``, as ``StoreClient.nodes()``
    lists them): it plans the read; each extent is then read from the node holding it.
    """

    def __init__(
        self, node: str, table: str, *, replica: int | None = None, columns: Sequence[str] | None = None
    ) -> None:
        from microco.common.errors import InvalidArgument

        if not table:
            raise InvalidArgument("a store table name is required")
        if replica is not None and replica not in (0, 1, 2):
            raise InvalidArgument(f"replica must be 0, 1 or 2, got {replica!r}")
        self.node, self.table, self.replica = node, table, replica
        self.columns = list(columns) if columns is not None else None
        self.url = f"store://{table}" + (f"?replica={replica}" if replica is not None else "")
        self._endpoints: dict[str, tuple[bytes, str]] | None = None  # path -> (ticket, location)

    # -- the BackingStore protocol
    def list_files(self) -> list[tuple[str, int]]:
        """One entry per extent (``<extent>`` or ``<extent>/<bucket>``), sorted. The size is
        0: an extent's bytes as a sample are known once read, and ``index_store_table`` (or
        ``build_index``) reads each once and records its real size."""
        return [(path, 0) for path in sorted(self._plan())]

    def read(self, path: str) -> bytes:
        from microco.clients.store import flight_client, from_flight_error
        from microco.common.errors import NotFound

        ep = self._plan().get(path)
        if ep is None:
            raise NotFound(f"table {self.table!r} has no extent {path!r}")
        ticket, location = ep
        import pyarrow.flight as flight

        client = flight_client(location)
        try:
            table = client.do_get(flight.Ticket(ticket)).read_all()
        except flight.FlightError as exc:
            raise from_flight_error(exc, f"extent {path} of table {self.table!r}") from exc
        finally:
            client.close()
        if self.columns is not None:
            table = table.select(self.columns)
        return _ipc_bytes(table)

    def write(self, path: str, data: bytes) -> None:
        from microco.common.errors import FailedPrecondition

        raise FailedPrecondition(f"{self.url} is read-only: write rows through the store's Append")

    # -- planning
    def _plan(self) -> dict[str, tuple[bytes, str]]:
        if self._endpoints is None:
            import pyarrow.flight as flight

            from microco.clients.store import flight_client, from_flight_error

            cmd: dict[str, Any] = {"table": self.table}
            if self.replica is not None:
                cmd["replica"] = self.replica
            client = flight_client(self.node)
            try:
                info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(cmd)))
            except flight.FlightError as exc:
                raise from_flight_error(exc, f"planning a read of table {self.table!r}") from exc
            finally:
                client.close()
            eps: dict[str, tuple[bytes, str]] = {}
            for ep in info.endpoints:
                ticket = ep.ticket.ticket
                t = json.loads(ticket)
                path = str(t.get("extent", len(eps)))
                if t.get("bucket") is not None:
                    path += f"/{t['bucket']}"
                eps[path] = (ticket, ep.locations[0].uri.decode())
            self._endpoints = eps
        return self._endpoints


def _ipc_bytes(table: Any) -> bytes:
    """The rows as one Arrow IPC stream (one record batch: the same rows give the same bytes)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return bytes(sink.getvalue().to_pybytes())


def decode_sample(data: bytes) -> Any:
    """A sample of a ``StoreTable`` dataset back into its rows (a ``pyarrow.Table``)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def index_store_table(source: StoreTable) -> DatasetIndex:
    """Index a store table: every extent read once, one sample and one chunk per extent."""
    # (chunks are planned from the listed sizes, unknown here: any size of at least the chunk
    # size makes every sample a chunk of its own; the index records the sizes read)
    return build_index([(path, 1) for path, _ in source.list_files()], source.read, chunk_bytes=1)
