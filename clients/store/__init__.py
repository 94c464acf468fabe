"""microco.clients.store: the Instalytics SDK.

``StoreClient`` talks to the coordinator (create, append, query, explain, nodes, recovery) and
reads scans straight from the store nodes over Arrow Flight. ``Frame`` is a small dataframe-like
builder for queries::

    client = StoreClient.from_etcd()  # the platform's etcd: MICROCO_ETCD, else the local stack
    orders = client.table("orders")
    top = (orders.filter("o_orderdate", ">=", "1995-01-01")
                 .group_by("o_custkey").agg(total=("sum", "o_totalprice"), n=("count", "*"))
                 .order_by("total", descending=True).limit(10).collect())
    print(orders.group_by("o_custkey").agg(n=("count", "*")).explain())
"""

from ._client import (
    RELAX_METADATA,
    Frame,
    StoreClient,
    check_codec,
    ipc_chunks,
    iter_file,
    load_file,
    parse_partitioning,
)
from ._files import infer_schema, read_source
from ._flight import OPTIONS as FLIGHT_OPTIONS
from ._flight import FlightClients, from_flight_error
from ._flight_tls import (
    check_grant,
    flight_caller,
    flight_client,
    grant_ticket,
    narrow_to_units,
    require_flight_service,
    secure_location,
    server_options,
)
from ._flight_tls import scheme as flight_scheme
from ._load import LOAD_FLOOR_S, LOAD_MIN_MB_PER_S, LoadProgress, file_deadline_s, file_rows, load_deadline_s
from ._storage import storage_report

__all__ = [
    "FLIGHT_OPTIONS",
    "LOAD_FLOOR_S",
    "LOAD_MIN_MB_PER_S",
    "RELAX_METADATA",
    "FlightClients",
    "Frame",
    "LoadProgress",
    "StoreClient",
    "check_codec",
    "check_grant",
    "file_deadline_s",
    "file_rows",
    "flight_caller",
    "flight_client",
    "flight_scheme",
    "from_flight_error",
    "grant_ticket",
    "infer_schema",
    "ipc_chunks",
    "iter_file",
    "load_deadline_s",
    "load_file",
    "narrow_to_units",
    "parse_partitioning",
    "read_source",
    "require_flight_service",
    "secure_location",
    "server_options",
    "storage_report",
]
