from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceInfo(_message.Message):
    __slots__ = ("name", "instance_id", "address", "version", "started_at", "metrics_address", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    instance_id: str
    address: str
    version: str
    started_at: float
    metrics_address: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., instance_id: _Optional[str] = ..., address: _Optional[str] = ..., version: _Optional[str] = ..., started_at: _Optional[float] = ..., metrics_address: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("id", "node", "index", "kind", "model", "memory_bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    node: str
    index: int
    kind: str
    model: str
    memory_bytes: int
    def __init__(self, id: _Optional[str] = ..., node: _Optional[str] = ..., index: _Optional[int] = ..., kind: _Optional[str] = ..., model: _Optional[str] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class Principal(_message.Message):
    __slots__ = ("user", "tenant")
    USER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    user: str
    tenant: str
    def __init__(self, user: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class PageRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
