"""Request and response models of the REST API (they make the published OpenAPI schema).

System objects (jobs, cache stats, tables, graphs) mirror the services' protobuf messages; their
models list the fields the console relies on and allow extra ones, so a service that adds a field
shows it in the API without a console release.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from ._limits import MAX_QUERY_DEPTH, MAX_QUERY_NODES, check_query_shape

INT64_MAX = 2**63 - 1


def _utf8(value: str) -> str:
    # JSON may carry lone surrogates that no protobuf string (UTF-8) can hold: refuse them here,
    # as bad input, rather than failing later in the scheduler's client.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from exc
    return value


Text = Annotated[str, AfterValidator(_utf8)]
# Bounded text (issue 16: every string, list and map of a request has a documented limit).
Name = Annotated[str, StringConstraints(max_length=200), AfterValidator(_utf8)]
Arg = Annotated[str, StringConstraints(max_length=4096), AfterValidator(_utf8)]
EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(_utf8)]
EnvValue = Annotated[str, StringConstraints(max_length=4096), AfterValidator(_utf8)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(BaseModel):
    error: str = Field(description="error type, e.g. NotFound, InvalidArgument, Unauthenticated")
    message: str


class Health(BaseModel):
    status: str = Field(description="ok")


class Readiness(BaseModel):
    ready: bool
    etcd: str
    redis: str


class WhoAmI(BaseModel):
    role: str = Field(description="admin (reads and changes) or viewer (reads only)")
    profile: str
    default_token: bool = Field(description="true when the well-known development token is in use")
    instance_id: str
    version: str


class Page(BaseModel):
    next_cursor: str = Field(
        default="", description="pass as `cursor` for the next page; empty on the last page"
    )


class ServiceView(BaseModel):
    name: str
    instance_id: str
    address: str
    version: str
    started_at: float
    uptime_s: float
    metrics_address: str
    labels: dict[str, str]
    health: str = Field(description="SERVING, NOT_SERVING or UNREACHABLE")


class GoneService(BaseModel):
    name: str
    instance_id: str
    address: str
    last_seen: float
    gone_at: float = Field(description="when the console first saw it missing from the registry")


class ServicesResponse(Page):
    services: list[ServiceView]
    at: float
    gone: list[GoneService] = Field(
        default=[], description="instances registered earlier (last 10 minutes) and not any more"
    )


class SystemView(BaseModel):
    name: str
    in_build: bool
    running: bool
    reason: str


class SystemsResponse(BaseModel):
    systems: list[SystemView]


class Availability(_Open):
    available: bool = Field(description="false when the system is not in this build or not running")
    reason: str = ""


class NodeView(BaseModel):
    name: str
    info: dict[str, Any]


class NodesResponse(Page):
    nodes: list[NodeView]
    devices: list[dict[str, Any]] = Field(
        description="devices the scheduler schedules, each with the jobs on it"
    )
    devices_reason: str = ""
    scheduler: dict[str, Any] = Field(
        default={},
        description="the scheduler's view: leader, policy, policy_settings (every setting in force)",
    )


class Period(BaseModel):
    state: str = Field(
        description="queued, running, suspended, packed, migrating, finished, failed, cancelled"
    )
    start: float
    end: float
    node: str
    devices: list[str]
    migrated: bool = Field(description="true when this period started on other devices than the previous one")


class JobView(_Open):
    id: str
    state: str = ""
    node: str = ""
    device_ids: list[str] = []
    step: int = 0
    submitted_at: float = 0.0
    timeline: list[Period] = []
    seconds_in_state: dict[str, float] = {}
    history: list[dict[str, Any]] = Field(default=[], description="the scheduler's own state history")


class JobsResponse(Availability, Page):
    jobs: list[JobView] = []


class ProgressPoint(_Open):
    at: float
    step: int = 0
    minibatch_ms: float = 0.0


class JobDetail(JobView):
    progress: list[ProgressPoint] = []


class JobLog(BaseModel):
    """The end of a job's output, as the node it ran on keeps it (``available`` false, with the
    reason, when no node keeps one: the job has not started, or its logs were collected)."""

    available: bool
    reason: str = ""
    job_id: str
    node: str = Field("", description="the node whose agent keeps the log")
    attempt: int = Field(0, description="which (re)start of the job the log is of (the latest)")
    attempts: list[int] = Field([], description="every attempt with a log on that node")
    text: str = Field("", description="the last lines of stdout and stderr")


class JobSubmit(BaseModel):
    """What the scheduler needs to run a training job."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1, description="a name people recognise")
    command: list[Arg] = Field(min_length=1, max_length=256, description="argv of the training process")
    devices: int = Field(ge=1, le=1024, description="devices wanted")
    elastic: bool = Field(default=False, description="may grow and shrink with idle devices")
    priority: int = Field(default=0, ge=-1000, le=1000)
    user: Name = Field(default="", description="owner of the job")
    env: dict[EnvKey, EnvValue] = Field(
        default_factory=dict, max_length=128, description="environment of the job (at most 128 variables)"
    )
    workdir: Arg = Field(default="")
    total_steps: int = Field(default=0, ge=0, le=INT64_MAX, description="optional, for progress")
    model: Name = Field(default="", description="model name: jobs of one model share a speed profile")
    max_devices: int = Field(
        default=0, ge=0, le=1024, description="elastic jobs: grow at most to this (0: policy decides)"
    )
    gpu_share: float = Field(
        default=1.0, gt=0.0, le=1.0, description="one-device jobs: fraction of a device the job needs"
    )


class JobControl(BaseModel):
    """An operator's command for one job, as ``microco job suspend|resume|migrate|resize`` sends it:
    checked by the scheduler at once, carried out at the job's next mini-batch boundary."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["suspend", "resume", "migrate", "resize"]
    devices: list[Arg] = Field(
        default=[], max_length=1024, description="migrate / resume / resize: these devices (node/index)"
    )
    device_count: int = Field(default=0, ge=0, le=1024, description="resize: to this many devices")


class JobRecord(_Open):
    id: str


class CacheServer(_Open):
    instance_id: str
    address: str
    error: str = ""
    stats: dict[str, Any] | None = None
    allocations: list[dict[str, Any]] = []
    hit_rate: list[dict[str, float | bool]] = Field(
        default=[], description="the server's hit rate per sampling interval"
    )
    job_hit_rate: dict[str, list[dict[str, float | bool]]] = Field(
        default={}, description="hit rate per interval of each job, when the server reports per-job counters"
    )


class CacheResponse(Availability, Page):
    servers: list[CacheServer] = []


class StoreResponse(Availability, Page):
    tables: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    recovery: dict[str, Any] | None = None
    recovery_history: list[dict[str, Any]] = Field(
        default=[],
        description="recovery figures sampled over time (unavailable extents, rebuilt, bytes read)",
    )


class StoreQuery(BaseModel):
    """A query in the store's JSON form (what ``microco store query --json`` and the SDK's
    ``Frame.to_json()`` produce): table, filters, projection, group-by, aggregates, join, order, limit."""

    model_config = ConfigDict(extra="forbid")

    query: Annotated[dict[str, Any], AfterValidator(check_query_shape)] = Field(
        max_length=64,
        description=(
            "the query, as the store coordinator reads it (at most 64 keys, nested at most "
            f"{MAX_QUERY_DEPTH} levels, {MAX_QUERY_NODES} values in all)"
        ),
    )
    limit_rows: int = Field(default=1000, ge=1, le=10000, description="rows to return at most")
    explain_only: bool = Field(default=False, description="only say how it would run (EXPLAIN)")


class StoreQueryResult(BaseModel):
    plan_kind: str = Field(description="how the planner ran it (matched replica, shuffle, ...)")
    explain: str
    replicas: Any = None
    columns: list[str]
    rows: list[list[Any]]
    row_count: int = Field(description="rows returned (the result is read no further than limit_rows)")
    truncated: bool = Field(description="true when the result has more rows than were returned")


class GraphView(_Open):
    key: str = ""
    trials: list[dict[str, Any]] = []
    committed: bool = False
    first_step_ms: float = 0.0
    best_step_ms: float = 0.0
    speedup: float = 0.0


class CompilerResponse(Availability, Page):
    graphs: list[GraphView] = []


class JobCacheDataset(_Open):
    dataset: str = ""
    hits: int = 0
    misses: int = 0
    bytes_served: int = 0
    hit_rate: float | None = Field(None, description="hits / (hits + misses); null before any lookup")


class JobCacheLinks(Availability):
    datasets: list[JobCacheDataset] = []
    hits: int = 0
    misses: int = 0
    bytes_served: int = 0
    hit_rate: float | None = None


class JobGraphView(GraphView):
    job: dict[str, Any] = Field(
        default_factory=dict,
        description="this job's registration: registered_at, committed (started committed)",
    )


class JobCompilerLinks(Availability):
    graphs: list[JobGraphView] = []


class JobLinks(BaseModel):
    """One job across the systems: timeline and scheduler history, cache hits, compiler graphs."""

    job: JobDetail
    cache: JobCacheLinks
    compiler: JobCompilerLinks
    at: float = 0.0


class Record(_Open):
    """A system object as its service returns it."""


class DevicePeriod(BaseModel):
    job_id: str
    name: str
    state: str
    start: float
    end: float
    migrated: bool


class DeviceLane(BaseModel):
    device: str
    node: str
    periods: list[DevicePeriod]


class DeviceUse(BaseModel):
    device: str
    node: str
    busy: list[float] = Field(description="fraction of each slice of the window a job was busy on it (0..1)")


class DevicesResponse(Availability, Page):
    start: float = 0.0
    end: float = 0.0
    bucket_s: float = Field(0.0, description="width of one utilisation slice, in seconds")
    lanes: list[DeviceLane] = []
    utilisation: list[DeviceUse] = []
