from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Variable(_message.Message):
    __slots__ = ("name", "choices", "region", "stage", "compiles", "compile_prior_ms", "prior_calibrated", "subsumes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    COMPILES_FIELD_NUMBER: _ClassVar[int]
    COMPILE_PRIOR_MS_FIELD_NUMBER: _ClassVar[int]
    PRIOR_CALIBRATED_FIELD_NUMBER: _ClassVar[int]
    SUBSUMES_FIELD_NUMBER: _ClassVar[int]
    name: str
    choices: _containers.RepeatedScalarFieldContainer[str]
    region: str
    stage: int
    compiles: bool
    compile_prior_ms: float
    prior_calibrated: bool
    subsumes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., choices: _Optional[_Iterable[str]] = ..., region: _Optional[str] = ..., stage: _Optional[int] = ..., compiles: _Optional[bool] = ..., compile_prior_ms: _Optional[float] = ..., prior_calibrated: _Optional[bool] = ..., subsumes: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterGraphRequest(_message.Message):
    __slots__ = ("fingerprint", "input_shapes", "hardware", "variables", "model_name", "framework", "total_steps", "job_id")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    input_shapes: str
    hardware: str
    variables: _containers.RepeatedCompositeFieldContainer[Variable]
    model_name: str
    framework: str
    total_steps: int
    job_id: str
    def __init__(self, fingerprint: _Optional[str] = ..., input_shapes: _Optional[str] = ..., hardware: _Optional[str] = ..., variables: _Optional[_Iterable[_Union[Variable, _Mapping]]] = ..., model_name: _Optional[str] = ..., framework: _Optional[str] = ..., total_steps: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class Config(_message.Message):
    __slots__ = ("key", "values", "committed", "trial", "steps", "hold")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    TRIAL_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    key: str
    values: _containers.ScalarMap[str, str]
    committed: bool
    trial: int
    steps: int
    hold: bool
    def __init__(self, key: _Optional[str] = ..., values: _Optional[_Mapping[str, str]] = ..., committed: _Optional[bool] = ..., trial: _Optional[int] = ..., steps: _Optional[int] = ..., hold: _Optional[bool] = ...) -> None: ...

class NextConfigRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class RegionTiming(_message.Message):
    __slots__ = ("region", "ms")
    REGION_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    region: str
    ms: float
    def __init__(self, region: _Optional[str] = ..., ms: _Optional[float] = ...) -> None: ...

class ReportTimingsRequest(_message.Message):
    __slots__ = ("key", "trial", "step_ms", "regions", "failed", "error", "pending", "runnable", "step_cpu_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TRIAL_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RUNNABLE_FIELD_NUMBER: _ClassVar[int]
    STEP_CPU_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    trial: int
    step_ms: _containers.RepeatedScalarFieldContainer[float]
    regions: _containers.RepeatedCompositeFieldContainer[RegionTiming]
    failed: bool
    error: str
    pending: bool
    runnable: float
    step_cpu_ms: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, key: _Optional[str] = ..., trial: _Optional[int] = ..., step_ms: _Optional[_Iterable[float]] = ..., regions: _Optional[_Iterable[_Union[RegionTiming, _Mapping]]] = ..., failed: _Optional[bool] = ..., error: _Optional[str] = ..., pending: _Optional[bool] = ..., runnable: _Optional[float] = ..., step_cpu_ms: _Optional[_Iterable[float]] = ...) -> None: ...

class Trial(_message.Message):
    __slots__ = ("trial", "values", "step_ms", "compile_ms", "steps", "regions", "done", "failed", "error", "stage", "kind", "runnable", "cpu_steps")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRIAL_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_MS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RUNNABLE_FIELD_NUMBER: _ClassVar[int]
    CPU_STEPS_FIELD_NUMBER: _ClassVar[int]
    trial: int
    values: _containers.ScalarMap[str, str]
    step_ms: float
    compile_ms: float
    steps: _containers.RepeatedScalarFieldContainer[float]
    regions: _containers.RepeatedCompositeFieldContainer[RegionTiming]
    done: bool
    failed: bool
    error: str
    stage: int
    kind: str
    runnable: float
    cpu_steps: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, trial: _Optional[int] = ..., values: _Optional[_Mapping[str, str]] = ..., step_ms: _Optional[float] = ..., compile_ms: _Optional[float] = ..., steps: _Optional[_Iterable[float]] = ..., regions: _Optional[_Iterable[_Union[RegionTiming, _Mapping]]] = ..., done: _Optional[bool] = ..., failed: _Optional[bool] = ..., error: _Optional[str] = ..., stage: _Optional[int] = ..., kind: _Optional[str] = ..., runnable: _Optional[float] = ..., cpu_steps: _Optional[_Iterable[float]] = ...) -> None: ...

class GraphState(_message.Message):
    __slots__ = ("key", "model_name", "framework", "variables", "trials", "best", "committed", "explore_steps", "explore_ms", "compile_ms", "baseline_ms", "best_ms", "speedup", "pruned", "fingerprint", "input_shapes", "hardware", "total_steps", "runs", "compile_costs", "reopened", "wait_steps", "wait_ms", "deferred", "retimes", "jobs")
    class CompileCostsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    BEST_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_STEPS_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_MS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_MS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_MS_FIELD_NUMBER: _ClassVar[int]
    BEST_MS_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_COSTS_FIELD_NUMBER: _ClassVar[int]
    REOPENED_FIELD_NUMBER: _ClassVar[int]
    WAIT_STEPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    RETIMES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    key: str
    model_name: str
    framework: str
    variables: _containers.RepeatedCompositeFieldContainer[Variable]
    trials: _containers.RepeatedCompositeFieldContainer[Trial]
    best: Config
    committed: bool
    explore_steps: int
    explore_ms: float
    compile_ms: float
    baseline_ms: float
    best_ms: float
    speedup: float
    pruned: _containers.RepeatedScalarFieldContainer[str]
    fingerprint: str
    input_shapes: str
    hardware: str
    total_steps: int
    runs: int
    compile_costs: _containers.ScalarMap[str, float]
    reopened: int
    wait_steps: int
    wait_ms: float
    deferred: int
    retimes: _containers.RepeatedScalarFieldContainer[str]
    jobs: _containers.RepeatedCompositeFieldContainer[GraphJob]
    def __init__(self, key: _Optional[str] = ..., model_name: _Optional[str] = ..., framework: _Optional[str] = ..., variables: _Optional[_Iterable[_Union[Variable, _Mapping]]] = ..., trials: _Optional[_Iterable[_Union[Trial, _Mapping]]] = ..., best: _Optional[_Union[Config, _Mapping]] = ..., committed: _Optional[bool] = ..., explore_steps: _Optional[int] = ..., explore_ms: _Optional[float] = ..., compile_ms: _Optional[float] = ..., baseline_ms: _Optional[float] = ..., best_ms: _Optional[float] = ..., speedup: _Optional[float] = ..., pruned: _Optional[_Iterable[str]] = ..., fingerprint: _Optional[str] = ..., input_shapes: _Optional[str] = ..., hardware: _Optional[str] = ..., total_steps: _Optional[int] = ..., runs: _Optional[int] = ..., compile_costs: _Optional[_Mapping[str, float]] = ..., reopened: _Optional[int] = ..., wait_steps: _Optional[int] = ..., wait_ms: _Optional[float] = ..., deferred: _Optional[int] = ..., retimes: _Optional[_Iterable[str]] = ..., jobs: _Optional[_Iterable[_Union[GraphJob, _Mapping]]] = ...) -> None: ...

class GraphJob(_message.Message):
    __slots__ = ("job_id", "registered_at", "committed")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    registered_at: float
    committed: bool
    def __init__(self, job_id: _Optional[str] = ..., registered_at: _Optional[float] = ..., committed: _Optional[bool] = ...) -> None: ...

class GetGraphRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ListGraphsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGraphsResponse(_message.Message):
    __slots__ = ("graphs",)
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    graphs: _containers.RepeatedCompositeFieldContainer[GraphState]
    def __init__(self, graphs: _Optional[_Iterable[_Union[GraphState, _Mapping]]] = ...) -> None: ...
