from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class LookupRequest(_message.Message):
    __slots__ = ("dataset", "digests", "job_id")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    digests: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    def __init__(self, dataset: _Optional[str] = ..., digests: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, present: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadChunksRequest(_message.Message):
    __slots__ = ("digests", "job_id")
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    def __init__(self, digests: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ...) -> None: ...

class ChunkData(_message.Message):
    __slots__ = ("digest", "data", "offset", "last", "dataset")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    digest: str
    data: bytes
    offset: int
    last: bool
    dataset: str
    def __init__(self, digest: _Optional[str] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., last: _Optional[bool] = ..., dataset: _Optional[str] = ...) -> None: ...

class PutChunksResponse(_message.Message):
    __slots__ = ("stored", "rejected")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    stored: _containers.RepeatedScalarFieldContainer[str]
    rejected: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stored: _Optional[_Iterable[str]] = ..., rejected: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheStats(_message.Message):
    __slots__ = ("capacity_bytes", "used_bytes", "chunks", "hits", "misses")
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    capacity_bytes: int
    used_bytes: int
    chunks: int
    hits: int
    misses: int
    def __init__(self, capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ...) -> None: ...
