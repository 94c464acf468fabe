from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LookupRequest(_message.Message):
    __slots__ = ("dataset", "digests", "job_id", "claim", "claim_lease_s", "wait_s")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    CLAIM_LEASE_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    digests: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    claim: _containers.RepeatedScalarFieldContainer[str]
    claim_lease_s: float
    wait_s: float
    def __init__(self, dataset: _Optional[str] = ..., digests: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ..., claim: _Optional[_Iterable[str]] = ..., claim_lease_s: _Optional[float] = ..., wait_s: _Optional[float] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("present", "room_bytes", "in_flight", "claimed")
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    ROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[str]
    room_bytes: int
    in_flight: _containers.RepeatedScalarFieldContainer[str]
    claimed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, present: _Optional[_Iterable[str]] = ..., room_bytes: _Optional[int] = ..., in_flight: _Optional[_Iterable[str]] = ..., claimed: _Optional[_Iterable[str]] = ...) -> None: ...

class SampleRead(_message.Message):
    __slots__ = ("chunk", "offset", "length", "digest")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    chunk: str
    offset: int
    length: int
    digest: str
    def __init__(self, chunk: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class ReadSamplesRequest(_message.Message):
    __slots__ = ("samples", "job_id", "dataset")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[SampleRead]
    job_id: str
    dataset: str
    def __init__(self, samples: _Optional[_Iterable[_Union[SampleRead, _Mapping]]] = ..., job_id: _Optional[str] = ..., dataset: _Optional[str] = ...) -> None: ...

class SampleData(_message.Message):
    __slots__ = ("position", "data", "missing")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    position: int
    data: bytes
    missing: bool
    def __init__(self, position: _Optional[int] = ..., data: _Optional[bytes] = ..., missing: _Optional[bool] = ...) -> None: ...

class SampleBatch(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[SampleData]
    def __init__(self, samples: _Optional[_Iterable[_Union[SampleData, _Mapping]]] = ...) -> None: ...

class ReadChunksRequest(_message.Message):
    __slots__ = ("digests", "job_id")
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    def __init__(self, digests: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ...) -> None: ...

class ChunkData(_message.Message):
    __slots__ = ("digest", "data", "offset", "last", "dataset", "missing")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    digest: str
    data: bytes
    offset: int
    last: bool
    dataset: str
    missing: bool
    def __init__(self, digest: _Optional[str] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., last: _Optional[bool] = ..., dataset: _Optional[str] = ..., missing: _Optional[bool] = ...) -> None: ...

class RejectedChunk(_message.Message):
    __slots__ = ("digest", "reason", "detail")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    digest: str
    reason: str
    detail: str
    def __init__(self, digest: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class PutChunksResponse(_message.Message):
    __slots__ = ("stored", "rejected", "present")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    stored: _containers.RepeatedScalarFieldContainer[str]
    rejected: _containers.RepeatedCompositeFieldContainer[RejectedChunk]
    present: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stored: _Optional[_Iterable[str]] = ..., rejected: _Optional[_Iterable[_Union[RejectedChunk, _Mapping]]] = ..., present: _Optional[_Iterable[str]] = ...) -> None: ...

class OpenChunksRequest(_message.Message):
    __slots__ = ("digests", "job_id")
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    def __init__(self, digests: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ...) -> None: ...

class ChunkGrant(_message.Message):
    __slots__ = ("digest", "path", "size")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    digest: str
    path: str
    size: int
    def __init__(self, digest: _Optional[str] = ..., path: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class OpenChunksResponse(_message.Message):
    __slots__ = ("grants", "node")
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[ChunkGrant]
    node: str
    def __init__(self, grants: _Optional[_Iterable[_Union[ChunkGrant, _Mapping]]] = ..., node: _Optional[str] = ...) -> None: ...

class ReportCorruptRequest(_message.Message):
    __slots__ = ("digest",)
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    def __init__(self, digest: _Optional[str] = ...) -> None: ...

class ReportCorruptResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: bool
    def __init__(self, dropped: _Optional[bool] = ...) -> None: ...

class BatchTiming(_message.Message):
    __slots__ = ("hit_fraction", "seconds", "bytes", "samples", "probe")
    HIT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    hit_fraction: float
    seconds: float
    bytes: int
    samples: int
    probe: bool
    def __init__(self, hit_fraction: _Optional[float] = ..., seconds: _Optional[float] = ..., bytes: _Optional[int] = ..., samples: _Optional[int] = ..., probe: _Optional[bool] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("job_id", "dataset", "user", "epoch", "consumed", "timings", "dataset_bytes", "finished", "miss_read_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    DATASET_BYTES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    MISS_READ_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    dataset: str
    user: str
    epoch: int
    consumed: _containers.RepeatedScalarFieldContainer[str]
    timings: _containers.RepeatedCompositeFieldContainer[BatchTiming]
    dataset_bytes: int
    finished: bool
    miss_read_s: float
    def __init__(self, job_id: _Optional[str] = ..., dataset: _Optional[str] = ..., user: _Optional[str] = ..., epoch: _Optional[int] = ..., consumed: _Optional[_Iterable[str]] = ..., timings: _Optional[_Iterable[_Union[BatchTiming, _Mapping]]] = ..., dataset_bytes: _Optional[int] = ..., finished: _Optional[bool] = ..., miss_read_s: _Optional[float] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("allocation_bytes", "reason")
    ALLOCATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    allocation_bytes: int
    reason: str
    def __init__(self, allocation_bytes: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DatasetUsage(_message.Message):
    __slots__ = ("dataset", "bytes", "chunks")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    bytes: int
    chunks: int
    def __init__(self, dataset: _Optional[str] = ..., bytes: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class CacheStats(_message.Message):
    __slots__ = ("capacity_bytes", "used_bytes", "chunks", "hits", "misses", "policy", "node", "evictions", "corrupt_dropped", "rejected", "bytes_served", "datasets", "jobs", "job_stats")
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_DROPPED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    JOB_STATS_FIELD_NUMBER: _ClassVar[int]
    capacity_bytes: int
    used_bytes: int
    chunks: int
    hits: int
    misses: int
    policy: str
    node: str
    evictions: int
    corrupt_dropped: int
    rejected: int
    bytes_served: int
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetUsage]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    job_stats: _containers.RepeatedCompositeFieldContainer[JobStats]
    def __init__(self, capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., policy: _Optional[str] = ..., node: _Optional[str] = ..., evictions: _Optional[int] = ..., corrupt_dropped: _Optional[int] = ..., rejected: _Optional[int] = ..., bytes_served: _Optional[int] = ..., datasets: _Optional[_Iterable[_Union[DatasetUsage, _Mapping]]] = ..., jobs: _Optional[_Iterable[str]] = ..., job_stats: _Optional[_Iterable[_Union[JobStats, _Mapping]]] = ...) -> None: ...

class JobStats(_message.Message):
    __slots__ = ("job_id", "dataset", "hits", "misses", "bytes_served")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    dataset: str
    hits: int
    misses: int
    bytes_served: int
    def __init__(self, job_id: _Optional[str] = ..., dataset: _Optional[str] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., bytes_served: _Optional[int] = ...) -> None: ...

class GetAllocationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("dataset", "bytes", "dataset_bytes", "benefit_s_per_gb", "jobs", "reason", "used_bytes")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DATASET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BENEFIT_S_PER_GB_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    bytes: int
    dataset_bytes: int
    benefit_s_per_gb: float
    jobs: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    used_bytes: int
    def __init__(self, dataset: _Optional[str] = ..., bytes: _Optional[int] = ..., dataset_bytes: _Optional[int] = ..., benefit_s_per_gb: _Optional[float] = ..., jobs: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., used_bytes: _Optional[int] = ...) -> None: ...

class GetAllocationsResponse(_message.Message):
    __slots__ = ("allocations", "capacity_bytes")
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    capacity_bytes: int
    def __init__(self, allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ..., capacity_bytes: _Optional[int] = ...) -> None: ...
