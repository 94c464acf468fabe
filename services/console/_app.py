"""The console's FastAPI application: REST API under ``/api/v1``, the web page under ``/``.

Every API endpoint needs a token (``Authorization: Bearer <token>``); only ``/healthz`` and
``/readyz`` do not, and the page's static files (HTML, JS, CSS: no data) load without one so that
the login form can appear. The admin token reads and changes; the viewer token only reads.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, status
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

import microco
from microco.common.errors import MicrocoError, PermissionDenied, Unauthenticated
from microco.common.kv import KV

from . import _views as views
from ._config import ConsoleConfig
from ._gateway import Gateway
from ._limits import DEFAULT_PAGE, MAX_BODY_BYTES, MAX_CURSOR, MAX_PAGE, BodyLimit, bounded_errors
from ._metrics import count_requests
from ._models import (
    CacheResponse,
    CompilerResponse,
    DevicesResponse,
    ErrorBody,
    GraphView,
    Health,
    JobControl,
    JobDetail,
    JobLinks,
    JobLog,
    JobRecord,
    JobsResponse,
    JobSubmit,
    NodesResponse,
    Readiness,
    Record,
    ServicesResponse,
    StoreQuery,
    StoreQueryResult,
    StoreResponse,
    SystemsResponse,
    WhoAmI,
)
from ._recorder import Recorder
from ._series import SeriesStore
from ._wall import ServiceTracker

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ConsoleToken",
    description="The console token: the admin token reads and changes, the viewer token only reads.",
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no token, or a wrong one"},
    503: {"model": ErrorBody, "description": "a service the answer needs is not reachable"},
}
_CHANGE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    400: {"model": ErrorBody, "description": "the service refused the request as invalid"},
    403: {"model": ErrorBody, "description": "the token may read but not change"},
    404: {"model": ErrorBody, "description": "no such object"},
    501: {"model": ErrorBody, "description": "the system is not part of this build"},
}


_HTTP_ERROR_NAMES = {
    400: "InvalidArgument",
    401: "Unauthenticated",
    403: "PermissionDenied",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
}


class Console:
    """The parts behind the app: settings, gateway to the platform, plot series, recorder."""

    def __init__(self, config: ConsoleConfig, gateway: Gateway, series: SeriesStore) -> None:
        self.config = config
        self.gateway = gateway
        self.series = series
        self.recorder = Recorder(gateway, series, config.sample_every_s)
        self.tracker = ServiceTracker()
        self.recorder.tracker = self.tracker
        self.started_at = time.time()

    def role_of(self, token: str) -> str | None:
        # Constant-time comparisons: a token must not be guessable from response timing.
        if hmac.compare_digest(token.encode(), self.config.token.encode()):
            return "admin"
        if self.config.view_token and hmac.compare_digest(token.encode(), self.config.view_token.encode()):
            return "viewer"
        return None


def _role(request: Request, creds: HTTPAuthorizationCredentials | None) -> str:
    console: Console = request.app.state.console
    if creds is None or not creds.credentials:
        raise Unauthenticated("a token is required: send 'Authorization: Bearer <token>'")
    role = console.role_of(creds.credentials)
    if role is None:
        raise Unauthenticated("the token is not valid for this console")
    return role


def require_reader(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    """Any valid token."""
    return _role(request, creds)


def require_admin(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    """The admin token: needed to change anything."""
    role = _role(request, creds)
    if role != "admin":
        raise PermissionDenied("this token may read but not change anything; use the admin token")
    return role


Reader = Annotated[str, Depends(require_reader)]
Admin = Annotated[str, Depends(require_admin)]
JobId = Annotated[str, PathParam(min_length=1, max_length=200, description="job id")]
TableName = Annotated[str, PathParam(min_length=1, max_length=200, description="table name")]
GraphKey = Annotated[
    str, PathParam(min_length=1, max_length=1000, description="graph key (fingerprint|shapes|hardware)")
]
StateFilter = Annotated[
    list[Annotated[str, Query(max_length=40)]] | None,
    Query(max_length=16, description="only jobs in these states"),
]
OwnerFilter = Annotated[str, Query(max_length=200, description="only this user's jobs")]
LogTail = Annotated[int, Query(ge=1, le=10_000, description="how many of the last lines")]
Limit = Annotated[
    int, Query(ge=1, le=MAX_PAGE, description=f"items per page (default {DEFAULT_PAGE}, at most {MAX_PAGE})")
]
WindowS = Annotated[
    float, Query(ge=60, le=7 * 86400, description="the time window shown, in seconds back from now")
]
HideFinishedS = Annotated[
    float, Query(ge=0, le=7 * 86400, description="leave out jobs that ended more than this many seconds ago")
]
Buckets = Annotated[int, Query(ge=1, le=500, description="slices of the window in the utilisation heatmap")]
Cursor = Annotated[
    str, Query(max_length=MAX_CURSOR, description="`next_cursor` of the previous page; empty for the first")
]


def _error_response(exc: MicrocoError) -> JSONResponse:
    status_code = exc.http_status
    # A failure inside another service is not a failure of the console: 502, not 500.
    if status_code == 500:
        status_code = 502
    headers = {"WWW-Authenticate": "Bearer"} if status_code == 401 else None
    return JSONResponse(
        status_code=status_code, content={"error": type(exc).__name__, "message": str(exc)}, headers=headers
    )


def create_app(
    config: ConsoleConfig,
    kv: KV,
    redis: Any = None,
    *,
    start_recorder: bool = True,
    use_redis: bool = True,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """The console app over ``kv`` (etcd, or ``MemoryKV`` in unit tests) and ``redis`` (a client;
    when None one is made from ``config.redis``, unless ``use_redis`` is False: then the plot
    series stay in memory)."""
    gateway = Gateway(config, kv, redis, use_redis=use_redis)
    series = SeriesStore(gateway.redis, limit=config.history_limit)
    console = Console(config, gateway, series)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        if start_recorder:
            console.recorder.start()
        try:
            yield
        finally:
            console.recorder.stop()
            gateway.close()
            if on_shutdown:
                on_shutdown()

    app = FastAPI(
        title="microco console",
        version=microco.__version__,
        description=(
            "Admin API of a microco platform: services and their health, nodes and devices, jobs "
            "and their history (scheduler), cache datasets, hit rates and allocations, store tables, "
            "replicas and recovery, compiler explorations and committed configurations. Every "
            "endpoint but /healthz and /readyz needs a bearer token; changes need the admin token."
        ),
        lifespan=lifespan,
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # FastAPI's docs page loads its scripts from a CDN: the console stays offline
        redoc_url=None,
    )
    app.state.console = console
    app.middleware("http")(count_requests)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    @app.exception_handler(MicrocoError)
    async def microco_error(request: Request, exc: MicrocoError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own refusals (unknown path, wrong method, a body that is not JSON) in the
        # same shape as every other error, as the schema promises.
        return JSONResponse(
            status_code=exc.status_code,
            content={
                "error": _HTTP_ERROR_NAMES.get(exc.status_code, "HTTPError"),
                "message": str(exc.detail),
            },
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's default handler echoes the input back as UTF-8 and fails (500) on text that
        # JSON may carry but UTF-8 may not (lone surrogates); ASCII JSON escapes them instead.
        # It also echoes the whole input: a 50 MB field made a 157 MB answer. Previews only.
        body = json.dumps({"detail": jsonable_encoder(bounded_errors(exc.errors()))}, ensure_ascii=True)
        return Response(content=body, status_code=422, media_type="application/json")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            status_code=500, content={"error": "Internal", "message": "internal error (see the console log)"}
        )

    # -- health: no token
    @app.get("/healthz", response_model=Health, tags=["health"], summary="liveness (no token)")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["health"],
        summary="readiness: etcd reachable (no token)",
        responses={503: {"model": Readiness}},
    )
    def readyz() -> Any:
        etcd = "ok"
        try:
            kv.get("/microco/services/__probe__")
        except MicrocoError as exc:
            etcd = str(exc)
        redis_state = "ok"
        r = gateway.redis
        try:
            if r is None:
                redis_state = "not configured"
            else:
                r.ping()
        except Exception as exc:  # noqa: BLE001 - Redis is optional: reported, not required
            redis_state = f"unreachable: {exc}"
        body = {"ready": etcd == "ok", "etcd": etcd, "redis": redis_state}
        return JSONResponse(body, status_code=200 if etcd == "ok" else 503)

    # -- the page
    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    # -- API
    api = "/api/v1"

    @app.get(f"{api}/whoami", response_model=WhoAmI, tags=["auth"], responses=_ERRORS)
    def whoami(role: Reader) -> dict[str, Any]:
        return {
            "role": role,
            "profile": config.profile,
            "default_token": config.uses_default_token,
            "instance_id": config.instance_id,
            "version": microco.__version__,
        }

    @app.get(f"{api}/services", response_model=ServicesResponse, tags=["platform"], responses=_ERRORS)
    def services(role: Reader, limit: Limit = DEFAULT_PAGE, cursor: Cursor = "") -> dict[str, Any]:
        """Every service instance registered in etcd, with its health (by name and instance)."""
        return views.services_view(gateway, limit, cursor, console.tracker)

    @app.get(f"{api}/systems", response_model=SystemsResponse, tags=["platform"], responses=_ERRORS)
    def systems(role: Reader) -> dict[str, Any]:
        """Which systems are part of this build and which are running."""
        return views.systems_view(gateway)

    @app.get(f"{api}/nodes", response_model=NodesResponse, tags=["platform"], responses=_ERRORS)
    def nodes(role: Reader, limit: Limit = DEFAULT_PAGE, cursor: Cursor = "") -> dict[str, Any]:
        """Nodes registered in etcd (by name) and the devices the scheduler schedules on them."""
        return views.nodes_view(gateway, limit, cursor)

    @app.get(f"{api}/devices", response_model=DevicesResponse, tags=["platform"], responses=_ERRORS)
    def devices(
        role: Reader,
        window_s: WindowS = 3600.0,
        hide_finished_s: HideFinishedS = 300.0,
        buckets: Buckets = 60,
        limit: Limit = DEFAULT_PAGE,
        cursor: Cursor = "",
    ) -> dict[str, Any]:
        """One timeline lane per device over the window (jobs that ended more than
        ``hide_finished_s`` ago left out) and each device's utilisation per slice of the window."""
        return views.devices_view(gateway, series, window_s, hide_finished_s, buckets, limit, cursor)

    @app.get(
        f"{api}/jobs",
        response_model=JobsResponse,
        tags=["jobs"],
        responses={**_ERRORS, 400: {"model": ErrorBody}},
    )
    def jobs(
        role: Reader,
        state: StateFilter = None,
        owner: OwnerFilter = "",
        limit: Limit = DEFAULT_PAGE,
        cursor: Cursor = "",
    ) -> dict[str, Any]:
        """Jobs with their device timeline (running, suspended, packed, migrated periods), newest first."""
        return views.list_jobs(gateway, series, state or [], owner, limit=limit, cursor=cursor)

    @app.post(
        f"{api}/jobs",
        response_model=JobRecord,
        status_code=status.HTTP_201_CREATED,
        tags=["jobs"],
        responses=_CHANGE_ERRORS,
    )
    def submit(spec: JobSubmit, role: Admin) -> dict[str, Any]:
        """Submit a training job to the scheduler (admin token)."""
        job = views.submit_job(gateway, spec.model_dump())
        log.info("job submitted through the console", extra={"job": job.get("id"), "job_name": spec.name})
        return job

    @app.get(f"{api}/jobs/{{job_id}}", response_model=JobDetail, tags=["jobs"], responses=_CHANGE_ERRORS)
    def job(job_id: JobId, role: Reader, window_s: WindowS = 3600.0) -> dict[str, Any]:
        """One job: its state, timeline and progress over the window (steps and mini-batch time)."""
        return views.get_job(gateway, series, job_id, window_s=window_s)

    @app.get(f"{api}/jobs/{{job_id}}/links", response_model=JobLinks, tags=["jobs"], responses=_CHANGE_ERRORS)
    def job_links(job_id: JobId, role: Reader, window_s: WindowS = 3600.0) -> dict[str, Any]:
        """One job across the systems: its device timeline and scheduler history, its cache hits,
        misses and bytes per dataset, and the compiler graphs it registered (configuration,
        trials, speedup)."""
        return views.job_links(gateway, series, job_id, window_s=window_s)

    @app.get(f"{api}/jobs/{{job_id}}/log", response_model=JobLog, tags=["jobs"], responses=_CHANGE_ERRORS)
    def job_log(job_id: JobId, role: Reader, tail: LogTail = 200) -> dict[str, Any]:
        """The last lines of a job's output (stdout and stderr of its latest attempt)."""
        return views.job_log(gateway, job_id, tail)

    @app.post(
        f"{api}/jobs/{{job_id}}/cancel", response_model=JobRecord, tags=["jobs"], responses=_CHANGE_ERRORS
    )
    def cancel(job_id: JobId, role: Admin) -> dict[str, Any]:
        """Cancel a job (admin token)."""
        job = views.cancel_job(gateway, job_id)
        log.info("job cancelled through the console", extra={"job": job_id})
        return job

    @app.post(
        f"{api}/jobs/{{job_id}}/control", response_model=JobRecord, tags=["jobs"], responses=_CHANGE_ERRORS
    )
    def control(job_id: JobId, command: JobControl, role: Admin) -> dict[str, Any]:
        """Suspend, resume, migrate or resize a job (admin token), as ``microco job suspend|resume|
        migrate|resize`` does: refused at once when the scheduler cannot carry it out."""
        job = views.control_job(gateway, job_id, command.action, command.devices, command.device_count)
        log.info("job %s through the console", command.action, extra={"job": job_id})
        return job

    @app.get(f"{api}/cache", response_model=CacheResponse, tags=["cache"], responses=_ERRORS)
    def cache(
        role: Reader, limit: Limit = DEFAULT_PAGE, cursor: Cursor = "", window_s: WindowS = 3600.0
    ) -> dict[str, Any]:
        """Cache servers: capacity and use, datasets, allocations and their reasons, hit rate over
        the window (points after a gap in the samples are marked ``gap``)."""
        return views.cache_view(gateway, series, limit, cursor, window_s=window_s)

    @app.get(f"{api}/store", response_model=StoreResponse, tags=["store"], responses=_ERRORS)
    def store(
        role: Reader, limit: Limit = DEFAULT_PAGE, cursor: Cursor = "", window_s: WindowS = 3600.0
    ) -> dict[str, Any]:
        """Tables (paged, by name) with their replicas' partitioning, store nodes, recovery progress
        over the window."""
        return views.store_view(gateway, series, limit, cursor, window_s=window_s)

    @app.get(f"{api}/store/tables/{{name}}", response_model=Record, tags=["store"], responses=_CHANGE_ERRORS)
    def store_table(name: TableName, role: Reader) -> dict[str, Any]:
        """One table as the store coordinator describes it."""
        return views.store_table(gateway, name)

    @app.post(f"{api}/store/query", response_model=StoreQueryResult, tags=["store"], responses=_CHANGE_ERRORS)
    def store_query(body: StoreQuery, role: Reader) -> dict[str, Any]:
        """Run a query (or EXPLAIN it) through the store coordinator; reading needs any token."""
        return views.store_query(gateway, body.query, body.limit_rows, body.explain_only)

    @app.post(f"{api}/store/recovery", response_model=Record, tags=["store"], responses=_CHANGE_ERRORS)
    def store_recovery(role: Admin) -> dict[str, Any]:
        """Look for lost extents and rebuild them now rather than at the next pass (admin token)."""
        log.info("store recovery started through the console")
        return views.store_start_recovery(gateway)

    @app.get(f"{api}/compiler", response_model=CompilerResponse, tags=["compiler"], responses=_ERRORS)
    def compiler(role: Reader, limit: Limit = DEFAULT_PAGE, cursor: Cursor = "") -> dict[str, Any]:
        """Graphs (by key) with their explorations (step time per trial) and committed configurations."""
        return views.compiler_view(gateway, limit, cursor)

    @app.get(
        f"{api}/compiler/graphs/{{key}}",
        response_model=GraphView,
        tags=["compiler"],
        responses=_CHANGE_ERRORS,
    )
    def compiler_graph(key: GraphKey, role: Reader) -> dict[str, Any]:
        """One graph's exploration and its committed configuration."""
        return views.compiler_graph(gateway, key)

    @app.get("/metrics", tags=["health"], responses=_ERRORS, response_class=Response)
    def metrics(role: Reader) -> Response:
        """Prometheus metrics of the console process (token required)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
