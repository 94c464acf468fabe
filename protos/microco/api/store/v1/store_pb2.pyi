from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PartitionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTITION_KIND_UNSPECIFIED: _ClassVar[PartitionKind]
    PARTITION_KIND_HASH: _ClassVar[PartitionKind]
    PARTITION_KIND_RANGE: _ClassVar[PartitionKind]
PARTITION_KIND_UNSPECIFIED: PartitionKind
PARTITION_KIND_HASH: PartitionKind
PARTITION_KIND_RANGE: PartitionKind

class Partitioning(_message.Message):
    __slots__ = ("column", "kind", "partitions", "range_bounds", "codec")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    RANGE_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    column: str
    kind: PartitionKind
    partitions: int
    range_bounds: _containers.RepeatedScalarFieldContainer[str]
    codec: str
    def __init__(self, column: _Optional[str] = ..., kind: _Optional[_Union[PartitionKind, str]] = ..., partitions: _Optional[int] = ..., range_bounds: _Optional[_Iterable[str]] = ..., codec: _Optional[str] = ...) -> None: ...

class Table(_message.Message):
    __slots__ = ("name", "arrow_schema", "replicas", "rows", "bytes", "super_extents", "extents", "unavailable_extents", "placement_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SUPER_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arrow_schema: bytes
    replicas: _containers.RepeatedCompositeFieldContainer[Partitioning]
    rows: int
    bytes: int
    super_extents: int
    extents: int
    unavailable_extents: int
    placement_json: str
    def __init__(self, name: _Optional[str] = ..., arrow_schema: _Optional[bytes] = ..., replicas: _Optional[_Iterable[_Union[Partitioning, _Mapping]]] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., super_extents: _Optional[int] = ..., extents: _Optional[int] = ..., unavailable_extents: _Optional[int] = ..., placement_json: _Optional[str] = ...) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("name", "arrow_schema", "replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    arrow_schema: bytes
    replicas: _containers.RepeatedCompositeFieldContainer[Partitioning]
    def __init__(self, name: _Optional[str] = ..., arrow_schema: _Optional[bytes] = ..., replicas: _Optional[_Iterable[_Union[Partitioning, _Mapping]]] = ...) -> None: ...

class DropTableRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DropTableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTableRequest(_message.Message):
    __slots__ = ("name", "placement")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    placement: bool
    def __init__(self, name: _Optional[str] = ..., placement: _Optional[bool] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[Table]
    def __init__(self, tables: _Optional[_Iterable[_Union[Table, _Mapping]]] = ...) -> None: ...

class StoreNode(_message.Message):
    __slots__ = ("name", "flight_address", "fault_domain", "alive", "bytes", "extents", "read_by_replica_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FAULT_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    READ_BY_REPLICA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    flight_address: str
    fault_domain: str
    alive: bool
    bytes: int
    extents: int
    read_by_replica_json: str
    def __init__(self, name: _Optional[str] = ..., flight_address: _Optional[str] = ..., fault_domain: _Optional[str] = ..., alive: _Optional[bool] = ..., bytes: _Optional[int] = ..., extents: _Optional[int] = ..., read_by_replica_json: _Optional[str] = ...) -> None: ...

class ListStoreNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListStoreNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[StoreNode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[StoreNode, _Mapping]]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("table", "arrow_ipc", "idempotency_token")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    table: str
    arrow_ipc: bytes
    idempotency_token: str
    def __init__(self, table: _Optional[str] = ..., arrow_ipc: _Optional[bytes] = ..., idempotency_token: _Optional[str] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("rows", "bytes", "super_extents")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SUPER_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    bytes: int
    super_extents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rows: _Optional[int] = ..., bytes: _Optional[int] = ..., super_extents: _Optional[_Iterable[int]] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("query_json",)
    QUERY_JSON_FIELD_NUMBER: _ClassVar[int]
    query_json: str
    def __init__(self, query_json: _Optional[str] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("arrow_ipc", "plan_kind", "explain", "replicas_json", "moved_bytes")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    PLAN_KIND_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_JSON_FIELD_NUMBER: _ClassVar[int]
    MOVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    plan_kind: str
    explain: str
    replicas_json: str
    moved_bytes: int
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., plan_kind: _Optional[str] = ..., explain: _Optional[str] = ..., replicas_json: _Optional[str] = ..., moved_bytes: _Optional[int] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("text", "plan_kind", "replicas_json")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PLAN_KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_JSON_FIELD_NUMBER: _ClassVar[int]
    text: str
    plan_kind: str
    replicas_json: str
    def __init__(self, text: _Optional[str] = ..., plan_kind: _Optional[str] = ..., replicas_json: _Optional[str] = ...) -> None: ...

class FlightEndpoint(_message.Message):
    __slots__ = ("address", "ticket")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    address: str
    ticket: bytes
    def __init__(self, address: _Optional[str] = ..., ticket: _Optional[bytes] = ...) -> None: ...

class PlanReadResponse(_message.Message):
    __slots__ = ("endpoints", "explain", "arrow_schema")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[FlightEndpoint]
    explain: str
    arrow_schema: bytes
    def __init__(self, endpoints: _Optional[_Iterable[_Union[FlightEndpoint, _Mapping]]] = ..., explain: _Optional[str] = ..., arrow_schema: _Optional[bytes] = ...) -> None: ...

class GetRecoveryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StartRecoveryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecoveryStatus(_message.Message):
    __slots__ = ("json", "unavailable_extents")
    JSON_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    json: str
    unavailable_extents: int
    def __init__(self, json: _Optional[str] = ..., unavailable_extents: _Optional[int] = ...) -> None: ...

class RecodeRequest(_message.Message):
    __slots__ = ("table", "replica", "codec")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    table: str
    replica: int
    codec: str
    def __init__(self, table: _Optional[str] = ..., replica: _Optional[int] = ..., codec: _Optional[str] = ...) -> None: ...

class ScrubRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScrubResponse(_message.Message):
    __slots__ = ("corrupt", "orphans_deleted", "orphan_bytes")
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_DELETED_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_BYTES_FIELD_NUMBER: _ClassVar[int]
    corrupt: _containers.RepeatedScalarFieldContainer[str]
    orphans_deleted: _containers.RepeatedScalarFieldContainer[str]
    orphan_bytes: int
    def __init__(self, corrupt: _Optional[_Iterable[str]] = ..., orphans_deleted: _Optional[_Iterable[str]] = ..., orphan_bytes: _Optional[int] = ...) -> None: ...

class TableGrantRequest(_message.Message):
    __slots__ = ("table", "user")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    table: str
    user: str
    def __init__(self, table: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class ListTableGrantsRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class TableGrants(_message.Message):
    __slots__ = ("table", "owner", "users")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    table: str
    owner: str
    users: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, table: _Optional[str] = ..., owner: _Optional[str] = ..., users: _Optional[_Iterable[str]] = ...) -> None: ...
