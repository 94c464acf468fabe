from microco.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUSPENDED: _ClassVar[JobState]
    JOB_STATE_PACKED: _ClassVar[JobState]
    JOB_STATE_MIGRATING: _ClassVar[JobState]
    JOB_STATE_FINISHED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUSPENDED: JobState
JOB_STATE_PACKED: JobState
JOB_STATE_MIGRATING: JobState
JOB_STATE_FINISHED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState

class JobSpec(_message.Message):
    __slots__ = ("name", "command", "devices", "elastic", "priority", "owner", "env", "workdir", "total_steps", "model", "max_devices", "gpu_share")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_DEVICES_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    name: str
    command: _containers.RepeatedScalarFieldContainer[str]
    devices: int
    elastic: bool
    priority: int
    owner: _common_pb2.Principal
    env: _containers.ScalarMap[str, str]
    workdir: str
    total_steps: int
    model: str
    max_devices: int
    gpu_share: float
    def __init__(self, name: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., devices: _Optional[int] = ..., elastic: _Optional[bool] = ..., priority: _Optional[int] = ..., owner: _Optional[_Union[_common_pb2.Principal, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[str] = ..., total_steps: _Optional[int] = ..., model: _Optional[str] = ..., max_devices: _Optional[int] = ..., gpu_share: _Optional[float] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "state", "device_ids", "node", "step", "submitted_at", "first_step_at", "finished_at", "minibatch_ms", "message", "attempt", "checkpoint_step", "restarts", "packed_with", "attained_service_s", "minibatch_ms_alone", "last_change_at", "history", "utilization")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PACKED_WITH_FIELD_NUMBER: _ClassVar[int]
    ATTAINED_SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_MS_ALONE_FIELD_NUMBER: _ClassVar[int]
    LAST_CHANGE_AT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: JobSpec
    state: JobState
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    node: str
    step: int
    submitted_at: float
    first_step_at: float
    finished_at: float
    minibatch_ms: float
    message: str
    attempt: int
    checkpoint_step: int
    restarts: int
    packed_with: _containers.RepeatedScalarFieldContainer[str]
    attained_service_s: float
    minibatch_ms_alone: float
    last_change_at: float
    history: _containers.RepeatedCompositeFieldContainer[StateChange]
    utilization: float
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., device_ids: _Optional[_Iterable[str]] = ..., node: _Optional[str] = ..., step: _Optional[int] = ..., submitted_at: _Optional[float] = ..., first_step_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., minibatch_ms: _Optional[float] = ..., message: _Optional[str] = ..., attempt: _Optional[int] = ..., checkpoint_step: _Optional[int] = ..., restarts: _Optional[int] = ..., packed_with: _Optional[_Iterable[str]] = ..., attained_service_s: _Optional[float] = ..., minibatch_ms_alone: _Optional[float] = ..., last_change_at: _Optional[float] = ..., history: _Optional[_Iterable[_Union[StateChange, _Mapping]]] = ..., utilization: _Optional[float] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("at", "state", "message")
    AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    at: float
    state: JobState
    message: str
    def __init__(self, at: _Optional[float] = ..., state: _Optional[_Union[JobState, str]] = ..., message: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "owner")
    STATES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[JobState]
    owner: str
    def __init__(self, states: _Optional[_Iterable[_Union[JobState, str]]] = ..., owner: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ControlJobRequest(_message.Message):
    __slots__ = ("job_id", "action", "devices", "device_count")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    action: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    device_count: int
    def __init__(self, job_id: _Optional[str] = ..., action: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., device_count: _Optional[int] = ...) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job", "at")
    JOB_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    job: Job
    at: float
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., at: _Optional[float] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("devices", "leader", "policy", "policy_settings_json")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_SETTINGS_JSON_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.Device]
    leader: str
    policy: str
    policy_settings_json: str
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.Device, _Mapping]]] = ..., leader: _Optional[str] = ..., policy: _Optional[str] = ..., policy_settings_json: _Optional[str] = ...) -> None: ...
