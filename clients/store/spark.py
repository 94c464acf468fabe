"""The store as a Spark 4 data source (Spark's Python DataSource API, ``pyspark>=4.0``)::

    from microco.clients.store.spark import StoreDataSource

    spark.dataSource.register(StoreDataSource)
    df = spark.read.format("microco").option("partitionBy", "o_custkey").load("orders")

One Spark partition per partition of the replica read (partitioned on ``partitionBy``, or the
replica given by ``replica``, else the one the coordinator's planner picks), in partition order:
Spark partition ``i`` holds exactly the rows of the store's partition ``i``. Each Spark task reads
its partition from the store nodes that hold it, over Arrow Flight with the platform's TLS
credentials (one ``do_get`` per node, in parallel); a lost extent is read from the matching
buckets of another replica, as the store's own queries do. Filters Spark pushes (Spark 4.1+, with
``spark.sql.python.filterPushdown.enabled``) on integer, string, date and boolean columns are
applied next to the data, and prune partitions on the partition column. Column pruning: the API
hands the reader only the schema it reads with, so columns are pruned by giving one
(``spark.read.format("microco").schema("o_orderkey long, o_custkey long")``). What the API does
not allow is telling Spark the partitioning (docs/store.md, "Spark").

Options: ``table`` (or the ``load`` path), ``address`` (the coordinator's gRPC ``host:port``; else
``etcd``, else the platform's etcd as ``microco`` finds it), ``replica`` (0, 1, 2),
``partitionBy`` (a column: the replica partitioned on it), ``credentials`` (a PEM file with the
caller's certificate and key, readable wherever Spark runs tasks; else the process's own,
``MICROCO_CREDENTIALS``).
"""

from __future__ import annotations

import datetime
import json
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

try:  # Spark 4.1+: filter pushdown
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
        Not,
    )

    PUSHDOWN = True
except ImportError:  # Spark 4.0: Spark filters after the scan
    PUSHDOWN = False

from microco.common.errors import InvalidArgument
from microco.common.identity import Identity

from ._client import StoreClient

FORMAT = "microco"
_OPS: dict[type, str] = (
    {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}
    if PUSHDOWN
    else {}
)


def _identity(options: Mapping[str, str]) -> Identity | None:
    path = options.get("credentials")  # options: Spark's (case-insensitive) or lower-cased keys
    if not path:
        return None  # the process's own (MICROCO_CREDENTIALS...), or plaintext in insecure mode
    try:
        return Identity.from_pem(Path(path).read_bytes(), path)
    except OSError as exc:
        raise InvalidArgument(f"credentials {path!r} cannot be read: {exc}") from None


def _client(options: Mapping[str, str]) -> StoreClient:
    from microco.common.channel import dial

    ident = _identity(options)
    address = options.get("address")
    if not address:
        from microco.common.discovery import connect_etcd
        from microco.common.registry import discover

        kv = connect_etcd(options.get("etcd") or None)
        try:
            records = discover(kv, StoreClient.service_name)
        finally:
            kv.close()
        if not records:
            raise InvalidArgument("no store coordinator is registered in etcd (option etcd, or address)")
        leaders = [r for r in records if r.labels.get("role") == "leader"]
        address = (leaders or records)[0].address
    client: StoreClient = StoreClient(dial(address, identity=ident))
    return client


def _table_name(options: Mapping[str, str]) -> str:
    name = options.get("table") or options.get("path")
    if not name:
        raise InvalidArgument('the store\'s data source needs a table: .option("table", ...) or .load(table)')
    return name


def _pushable(f: Any, types: Mapping[str, pa.DataType]) -> list[Any] | None:
    """The store's filter ``[column, op, value]`` exactly equivalent to Spark's ``f``, or None.
    Only integer, string, date and boolean columns: on floats Spark orders NaN above every number
    and the store's comparisons do not; decimals and timestamps are left to Spark."""
    neg = isinstance(f, Not)
    inner: Any = f.child if neg else f
    attr: tuple[str, ...] = tuple(getattr(inner, "attribute", ()))
    if len(attr) != 1 or attr[0] not in types:
        return None
    col, typ = attr[0], types[attr[0]]
    if pa.types.is_boolean(typ):
        ok: Any = bool
    elif pa.types.is_integer(typ):
        ok = int
    elif pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ):
        ok = str
    elif pa.types.is_date32(typ) or pa.types.is_date64(typ):
        ok = datetime.date
    else:
        return None

    def fits(v: Any) -> bool:
        if v is None or isinstance(v, datetime.datetime) or not isinstance(v, ok):
            return False
        if ok is int and isinstance(v, bool):
            return False
        try:
            pa.array([v]).cast(typ)  # an int out of the column's range is not pushed
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return False
        return True

    if isinstance(inner, In):
        values = list(inner.value)
        if neg or not values or not all(fits(v) for v in values):
            return None
        return [col, "in", [v.isoformat() if isinstance(v, datetime.date) else v for v in values]]
    op = _OPS.get(type(inner))
    if op is None or not fits(inner.value) or (neg and op != "="):
        return None
    value = inner.value.isoformat() if isinstance(inner.value, datetime.date) else inner.value
    return [col, "!=" if neg else op, value]


def _spark_type(t: pa.DataType) -> pa.DataType:
    """``t`` as an Arrow type Spark converts, holding every value exactly: unsigned integers in
    the next wider signed type (a uint64 as decimal(20, 0), as Spark's Parquet reader reads
    one), a time of day as its text (``01:02:03.000005``: Spark 4's TIME type is refused by its
    analyser, "The data type TIME is not supported", so not even ``count()`` ran), date64 as
    date32; nested types field by field."""
    if pa.types.is_uint64(t):
        return pa.decimal128(20, 0)
    widen = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}
    if t in widen:
        return widen[t]
    if pa.types.is_time(t):
        return pa.string()
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_spark_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_spark_type(t.key_type), _spark_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_spark_type(t.value_type)))
    return t


def spark_readable(schema: pa.Schema) -> pa.Schema:
    """A table's schema in types Spark's Arrow conversion takes (``_spark_type``): before (held
    out, session 39) a table with a uint64, time32 or date64 column could not be loaded in Spark
    at all ("uint64 is not supported in conversion to Arrow"), one with a time64 column not
    counted. ``read`` casts to it, exactly."""
    return pa.schema([f.with_type(_spark_type(f.type)) for f in schema])


class StorePartition(InputPartition):  # type: ignore[misc]
    """Partition ``partition`` of replica ``replica``: one Flight read per node holding its rows."""

    def __init__(self, replica: int, partition: int, reads: list[tuple[str, str]]) -> None:
        super().__init__(partition)
        self.replica, self.partition = replica, partition
        self.reads = reads  # (node's Flight address, ticket JSON)


def split_by_partition(
    endpoints: Sequence[tuple[str, dict[str, Any]]],
) -> tuple[int | None, dict[int, list[tuple[str, str]]]]:
    """The replica a PlanRead plan reads and its fragments cut per partition: partition ->
    [(node address, ticket)], one ticket per node holding part of it (a partition spans nodes
    when the table has several super-extents, or is read degraded)."""
    replica: int | None = None
    out: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for address, task in endpoints:
        side = task["left"]
        by_part: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for src in side["sources"]:
            if "unit" not in src:
                raise InvalidArgument("the store coordinator is too old to split a read by partition")
            r, p = src["unit"]
            replica = r
            by_part[p].append(src)
        for p in sorted(by_part):
            # the ticket as granted (its signature covers it), narrowed by the node to the
            # sources of this partition (``units``: unsigned, it can only drop sources)
            one = {**task, "units": [[replica, p]]}
            out[p].append((address, json.dumps(one, default=str)))
    return replica, dict(out)


class StoreReader(DataSourceReader):  # type: ignore[misc]
    """Reads one table: ``partitions()`` asks the coordinator where (one PlanRead), ``read()``
    fetches a partition from the nodes that hold it."""

    def __init__(self, options: Mapping[str, str], schema: StructType, table_schema: pa.Schema) -> None:
        self.options = {k.lower(): v for k, v in options.items()}  # Spark's options ignore case
        self.table = _table_name(self.options)
        self.columns = list(schema.fieldNames())
        missing = [c for c in self.columns if c not in table_schema.names]
        if missing:
            raise InvalidArgument(f"table {self.table!r} has no column(s) {missing}")
        self.types = {f.name: f.type for f in table_schema}
        self.spark_schema = schema
        self.where: list[list[Any]] = []

    def _replica(self, client: StoreClient) -> int | None:
        r = self.options.get("replica")
        by = self.options.get("partitionby")
        if r not in (None, ""):
            if str(r) not in ("0", "1", "2"):
                raise InvalidArgument(f"replica must be 0, 1 or 2, got {r!r}")
            return int(r)
        if by:
            specs = client.get_table(self.table)["replicas"]
            for i, spec in enumerate(specs):
                if spec["column"] == by:
                    return i
            cols = [s["column"] for s in specs]
            raise InvalidArgument(f"table {self.table!r} has no replica partitioned on {by!r} (only {cols})")
        return None

    def partitions(self) -> Sequence[InputPartition]:
        client = _client(self.options)
        try:
            replica = self._replica(client)
            plan = client.plan_read_pb(self.table, self.where, self.columns, replica=replica)
            table = client.get_table(self.table)
        finally:
            client.close()
        endpoints = [(ep.address, json.loads(ep.ticket)) for ep in plan.endpoints]
        chosen, parts = split_by_partition(endpoints)
        r = replica if replica is not None else chosen
        if r is None:
            return [StorePartition(-1, 0, [])]  # nothing to read (an empty table, or all pruned)
        spec = table["replicas"][r]
        count = spec["partitions"] if spec["kind"] == "hash" else len(spec["bounds"]) + 1
        # every partition of the replica, the empty and pruned ones too: Spark's partition i is the
        # store's partition i
        return [StorePartition(r, p, parts.get(p, [])) for p in range(max(count, 1))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        from ._flight import FlightClients

        reads = getattr(partition, "reads", [])
        if not reads:
            return
        # Spark takes a zoned timestamp as UTC microseconds (held out, session 39: without a zone
        # to_arrow_schema failed an assertion, and every read of a table with such a column)
        target = to_arrow_schema(self.spark_schema, timezone="UTC")
        clients = FlightClients(ident=_identity(self.options))
        try:
            if len(reads) == 1:
                tables = [clients.do_get(reads[0][0], reads[0][1].encode())]
            else:
                with ThreadPoolExecutor(max_workers=min(8, len(reads))) as pool:
                    tables = list(pool.map(lambda rd: clients.do_get(rd[0], rd[1].encode()), reads))
        finally:
            clients.close()
        for t in tables:
            if t.num_rows == 0:
                continue
            t = t.select(self.columns).replace_schema_metadata(None)
            if t.schema != target:
                t = t.cast(target)
            yield from t.to_batches()


class FilteringStoreReader(StoreReader):
    """``StoreReader`` that takes the filters Spark pushes (Spark 4.1+; Spark refuses a reader
    with ``pushFilters`` unless ``spark.sql.python.filterPushdown.enabled`` is on, hence two
    classes: option ``pushFilters`` = false picks the other)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        for f in filters:
            w = _pushable(f, self.types)
            if w is None:
                yield f  # Spark evaluates it after the scan
            else:
                self.where.append(w)


class StoreDataSource(DataSource):  # type: ignore[misc]
    """``spark.dataSource.register(StoreDataSource)``, then ``spark.read.format("microco")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _arrow_schema(self) -> pa.Schema:
        client = _client(self.options)
        try:
            schema: pa.Schema = client.get_table(_table_name(self.options))["schema"]
        finally:
            client.close()
        return schema

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(spark_readable(self._arrow_schema()), prefer_timestamp_ntz=True)

    def reader(self, schema: StructType) -> DataSourceReader:
        push = PUSHDOWN and str(self.options.get("pushFilters", "true")).lower() not in ("false", "0", "no")
        cls = FilteringStoreReader if push else StoreReader
        return cls(self.options, schema, self._arrow_schema())
