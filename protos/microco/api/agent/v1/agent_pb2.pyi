from microco.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Control(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_UNSPECIFIED: _ClassVar[Control]
    CONTROL_SUSPEND: _ClassVar[Control]
    CONTROL_RESUME: _ClassVar[Control]
    CONTROL_CHECKPOINT: _ClassVar[Control]
    CONTROL_RESIZE: _ClassVar[Control]
    CONTROL_STOP: _ClassVar[Control]

class ProcessState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROCESS_STATE_UNSPECIFIED: _ClassVar[ProcessState]
    PROCESS_STATE_STARTING: _ClassVar[ProcessState]
    PROCESS_STATE_RUNNING: _ClassVar[ProcessState]
    PROCESS_STATE_EXITED: _ClassVar[ProcessState]
CONTROL_UNSPECIFIED: Control
CONTROL_SUSPEND: Control
CONTROL_RESUME: Control
CONTROL_CHECKPOINT: Control
CONTROL_RESIZE: Control
CONTROL_STOP: Control
PROCESS_STATE_UNSPECIFIED: ProcessState
PROCESS_STATE_STARTING: ProcessState
PROCESS_STATE_RUNNING: ProcessState
PROCESS_STATE_EXITED: ProcessState

class Node(_message.Message):
    __slots__ = ("name", "address", "devices", "labels", "instance_id", "preloaded")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PRELOADED_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.Device]
    labels: _containers.ScalarMap[str, str]
    instance_id: str
    preloaded: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_common_pb2.Device, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., instance_id: _Optional[str] = ..., preloaded: _Optional[_Iterable[str]] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StartProcessRequest(_message.Message):
    __slots__ = ("job_id", "command", "env", "device_ids", "workdir", "checkpoint_dir", "attempt")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    checkpoint_dir: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., device_ids: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class ControlProcessRequest(_message.Message):
    __slots__ = ("job_id", "control", "device_ids")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    control: Control
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., control: _Optional[_Union[Control, str]] = ..., device_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StopProcessRequest(_message.Message):
    __slots__ = ("job_id", "grace_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    grace_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class ProcessStatus(_message.Message):
    __slots__ = ("job_id", "pid", "state", "exit_code", "device_ids", "attempt", "job_state", "step", "minibatch_ms", "seq_done", "control_seq", "checkpoint_step", "checkpoint_bytes", "started_at", "first_step_at", "updated_at", "suspend_ms", "resume_ms", "peak_rss_bytes", "message", "restored_from_step", "forked", "utilization", "timed_steps", "timed_ms", "timed_sq_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_MS_FIELD_NUMBER: _ClassVar[int]
    SEQ_DONE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_SEQ_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_MS_FIELD_NUMBER: _ClassVar[int]
    RESUME_MS_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    FORKED_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    TIMED_STEPS_FIELD_NUMBER: _ClassVar[int]
    TIMED_MS_FIELD_NUMBER: _ClassVar[int]
    TIMED_SQ_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    pid: int
    state: ProcessState
    exit_code: int
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    attempt: int
    job_state: str
    step: int
    minibatch_ms: float
    seq_done: int
    control_seq: int
    checkpoint_step: int
    checkpoint_bytes: int
    started_at: float
    first_step_at: float
    updated_at: float
    suspend_ms: float
    resume_ms: float
    peak_rss_bytes: int
    message: str
    restored_from_step: int
    forked: bool
    utilization: float
    timed_steps: int
    timed_ms: float
    timed_sq_ms: float
    def __init__(self, job_id: _Optional[str] = ..., pid: _Optional[int] = ..., state: _Optional[_Union[ProcessState, str]] = ..., exit_code: _Optional[int] = ..., device_ids: _Optional[_Iterable[str]] = ..., attempt: _Optional[int] = ..., job_state: _Optional[str] = ..., step: _Optional[int] = ..., minibatch_ms: _Optional[float] = ..., seq_done: _Optional[int] = ..., control_seq: _Optional[int] = ..., checkpoint_step: _Optional[int] = ..., checkpoint_bytes: _Optional[int] = ..., started_at: _Optional[float] = ..., first_step_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., suspend_ms: _Optional[float] = ..., resume_ms: _Optional[float] = ..., peak_rss_bytes: _Optional[int] = ..., message: _Optional[str] = ..., restored_from_step: _Optional[int] = ..., forked: _Optional[bool] = ..., utilization: _Optional[float] = ..., timed_steps: _Optional[int] = ..., timed_ms: _Optional[float] = ..., timed_sq_ms: _Optional[float] = ...) -> None: ...

class ListProcessesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessStatus]
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessStatus, _Mapping]]] = ...) -> None: ...

class CollectGarbageRequest(_message.Message):
    __slots__ = ("keep_job_ids", "keep_logs_job_ids")
    KEEP_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    KEEP_LOGS_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    keep_job_ids: _containers.RepeatedScalarFieldContainer[str]
    keep_logs_job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keep_job_ids: _Optional[_Iterable[str]] = ..., keep_logs_job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CollectGarbageResponse(_message.Message):
    __slots__ = ("deleted_job_ids", "bytes_freed")
    DELETED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    deleted_job_ids: _containers.RepeatedScalarFieldContainer[str]
    bytes_freed: int
    def __init__(self, deleted_job_ids: _Optional[_Iterable[str]] = ..., bytes_freed: _Optional[int] = ...) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "offset", "tail_lines", "follow")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    offset: int
    tail_lines: int
    follow: bool
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., offset: _Optional[int] = ..., tail_lines: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("attempt", "offset", "data", "attempts")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    offset: int
    data: bytes
    attempts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, attempt: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., attempts: _Optional[_Iterable[int]] = ...) -> None: ...
