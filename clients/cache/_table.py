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

A query's result has no extents: ``materialise_query`` writes it back to the store once, as a
table of its own (sorted by every column, cut into samples of at most ``rows_per_sample`` rows
by a range-partitioned ``_sample`` column), and ``query_table`` reads that table as above. The
table's name is a digest of the query, the sample size and the store's tables' row counts, so
the same query on the same data names the same table (and the same bytes): a second job finds
it and shares the first one's cache entries; an append anywhere names a new one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from ._index import DatasetIndex, index_store

QUERY_TABLE_PREFIX = "q_"  # tables that hold a query's result (materialise_query)
SAMPLE_COLUMN = "_sample"


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
        query = ([f"replica={replica}"] if replica is not None else []) + (
            [f"columns={quote(','.join(self.columns), safe=',')}"] if self.columns is not None else []
        )
        self.url = f"store://{table}" + (f"?{'&'.join(query)}" if query else "")
        self._endpoints: dict[str, tuple[bytes, str]] | None = None  # path -> (ticket, location)

    # Each extent is a sample and a chunk of its own (``index_store`` reads this).
    chunk_per_file = True

    @classmethod
    def from_url(cls, url: str, kv: Any = None, node: str | None = None) -> StoreTable:
        """The table a ``store://<table>?replica=R&columns=a,b`` URL names (what ``url`` gives);
        its read planned by ``node``, else by a live store node the coordinator in etcd (``kv``,
        else the platform's) lists."""
        from microco.common.errors import InvalidArgument

        parts = urlsplit(url)
        if parts.scheme != "store" or not parts.netloc or parts.path not in ("", "/"):
            raise InvalidArgument(f"bad store table URL {url!r}: store://<table>?replica=R&columns=a,b")
        args = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        unknown = set(args) - {"replica", "columns", "partitioned_by"}
        if unknown:
            raise InvalidArgument(f"bad store table URL {url!r}: unknown {', '.join(sorted(unknown))}")
        if "replica" in args and "partitioned_by" in args:
            raise InvalidArgument(f"bad store table URL {url!r}: replica or partitioned_by, not both")
        try:
            replica = int(args["replica"]) if "replica" in args else None
        except ValueError:
            raise InvalidArgument(f"bad replica in {url!r}: 0, 1 or 2") from None
        columns = [c for c in args["columns"].split(",") if c] if "columns" in args else None
        if node is None or "partitioned_by" in args:
            from microco.clients.store import StoreClient

            client = StoreClient.from_etcd(kv)
            try:
                if "partitioned_by" in args:
                    replica = replica_partitioned_by(client, parts.netloc, args["partitioned_by"])
                node = node or live_node(client, url)
            finally:
                client.close()
        return cls(node, parts.netloc, replica=replica, columns=columns)

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
    return index_store(source)


def materialise_query(
    client: Any, sql: str, *, rows_per_sample: int = 1024, table: str | None = None, timeout_s: float = 120.0
) -> str:
    """The name of a store table holding the result of ``sql`` (a SELECT), written once.

    The rows are sorted by every column, left to right (whatever order the query gives: the
    result of a parallel query comes in no fixed order, and the bytes of a sample must not
    depend on it), and numbered; a ``_sample`` column (row number // ``rows_per_sample``)
    range-partitions replica 0, so each of its extents holds at most ``rows_per_sample`` rows
    of one sample (a super-extent boundary may cut a sample in two extents, at the same rows
    every time). ``table``: the name to write (default: ``q_`` and a digest of the query, the
    sample size and the store's other tables' row counts, see the module's doc). A table of that
    name already there is the result (a second job, or one materialising it at the same time:
    waited for, up to ``timeout_s``, until its rows are committed)."""
    import blake3
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from microco.common.errors import AlreadyExists, DeadlineExceeded, InvalidArgument, NotFound

    words = sql.lstrip(" \t\r\n(").split(None, 1)
    if not words or words[0].lower() not in ("select", "with"):
        shown = sql if len(sql) <= 60 else sql[:57] + "..."
        raise InvalidArgument(f"only a SELECT query's result can be a dataset, not {shown!r}")
    if rows_per_sample < 1:
        raise InvalidArgument(f"rows_per_sample must be at least 1, got {rows_per_sample}")
    if table is None:
        tables = sorted(
            (t["name"], t["rows"])
            for t in client.list_tables()
            if not t["name"].startswith(QUERY_TABLE_PREFIX)
        )
        key = json.dumps({"sql": sql, "rows_per_sample": rows_per_sample, "tables": tables})
        table = QUERY_TABLE_PREFIX + blake3.blake3(key.encode()).hexdigest()[:24]

    def committed() -> bool:
        try:
            return bool(client.get_table(table)["rows"])
        except NotFound:
            return False

    if committed():
        return table
    result = client.sql(sql)
    if not result.num_rows:
        raise InvalidArgument(f"query {sql!r} returned no rows: an empty dataset")
    if SAMPLE_COLUMN in result.column_names:
        raise InvalidArgument(f"a query's result to be a dataset cannot have a column {SAMPLE_COLUMN!r}")
    try:
        order = pc.sort_indices(result, sort_keys=[(c, "ascending") for c in result.column_names])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
        raise InvalidArgument(
            f"the query's result cannot be ordered (a dataset's rows need one): {exc}"
        ) from None
    rows = result.take(order)
    n = rows.num_rows
    rows = rows.append_column(SAMPLE_COLUMN, pa.array(np.arange(n, dtype=np.int64) // rows_per_sample))
    samples = -(-n // rows_per_sample)
    bounds = ",".join(str(k) for k in range(1, samples))
    by_sample = f"{SAMPLE_COLUMN}:range:{bounds}" if bounds else f"{SAMPLE_COLUMN}:hash:1"
    try:
        # replicas 1 and 2 keep every row in one partition: a bucket of theirs is one sample
        client.create_table(
            table, rows.schema, [by_sample, f"{SAMPLE_COLUMN}:hash:1", f"{SAMPLE_COLUMN}:hash:1"]
        )
    except AlreadyExists:
        deadline = time.monotonic() + timeout_s
        while not committed():  # another job is writing it
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"table {table!r} (the result of {sql!r}) exists but holds no rows after "
                    f"{timeout_s:.0f} s: drop it to materialise the query again"
                ) from None
            time.sleep(0.2)
        return table
    client.append(table, rows)
    return table


def query_table(
    client: Any, sql: str, *, rows_per_sample: int = 1024, node: str | None = None, table: str | None = None
) -> StoreTable:
    """A query's result as a dataset's backing store: ``materialise_query``'s table, replica 0
    (one sample of at most ``rows_per_sample`` rows an extent), without the ``_sample`` column;
    read planned by ``node`` (default: the first live store node ``client`` lists)."""
    name = materialise_query(client, sql, rows_per_sample=rows_per_sample, table=table)
    columns = [f.name for f in client.get_table(name)["schema"] if f.name != SAMPLE_COLUMN]
    return StoreTable(node or live_node(client, name), name, replica=0, columns=columns)


def replica_partitioned_by(client: Any, table: str, column: str) -> int:
    """The replica of ``table`` partitioned by ``column`` (the job's label or shard key): each of
    its extents, one sample of the dataset, holds the rows of one range or hash bucket of that
    column. ``client``: a ``StoreClient``. ``store://<table>?partitioned_by=<column>`` asks for
    it by name."""
    from microco.common.errors import InvalidArgument

    replicas = client.get_table(table)["replicas"]
    for i, r in enumerate(replicas):
        if r["column"] == column:
            return i
    by = ", ".join(f"{i}: {r['column']} ({r['kind']})" for i, r in enumerate(replicas))
    raise InvalidArgument(f"no replica of table {table!r} is partitioned by {column!r} (replicas: {by})")


def live_node(client: Any, what: str) -> str:
    """The Flight address of the first live store node ``client``'s coordinator lists."""
    from microco.common.errors import Unavailable

    live = [n["address"] for n in client.nodes() if n["alive"]]
    if not live:
        raise Unavailable(f"no live store node to read {what} from")
    return str(live[0])
