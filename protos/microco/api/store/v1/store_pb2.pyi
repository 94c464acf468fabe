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
    __slots__ = ("column", "kind", "partitions", "range_bounds")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    RANGE_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    column: str
    kind: PartitionKind
    partitions: int
    range_bounds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, column: _Optional[str] = ..., kind: _Optional[_Union[PartitionKind, str]] = ..., partitions: _Optional[int] = ..., range_bounds: _Optional[_Iterable[str]] = ...) -> None: ...

class Table(_message.Message):
    __slots__ = ("name", "arrow_schema", "replicas", "rows", "bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    arrow_schema: bytes
    replicas: _containers.RepeatedCompositeFieldContainer[Partitioning]
    rows: int
    bytes: int
    def __init__(self, name: _Optional[str] = ..., arrow_schema: _Optional[bytes] = ..., replicas: _Optional[_Iterable[_Union[Partitioning, _Mapping]]] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[Table]
    def __init__(self, tables: _Optional[_Iterable[_Union[Table, _Mapping]]] = ...) -> None: ...

class StoreNode(_message.Message):
    __slots__ = ("name", "flight_address", "fault_domain", "alive", "bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FAULT_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    flight_address: str
    fault_domain: str
    alive: bool
    bytes: int
    def __init__(self, name: _Optional[str] = ..., flight_address: _Optional[str] = ..., fault_domain: _Optional[str] = ..., alive: _Optional[bool] = ..., bytes: _Optional[int] = ...) -> None: ...

class ListStoreNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListStoreNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[StoreNode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[StoreNode, _Mapping]]] = ...) -> None: ...
