"""The console's own Prometheus metrics (``microco_console_*``), beside the shared ones."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter, Histogram
from starlette.requests import Request
from starlette.responses import Response

HTTP_REQUESTS = Counter(
    "microco_console_http_requests_total",
    "console HTTP requests, by method, route template and status",
    ["method", "route", "status"],
)
HTTP_LATENCY = Histogram(
    "microco_console_http_latency_seconds",
    "console HTTP request latency, by route template",
    ["route"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)


async def count_requests(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Middleware: count every request under its route template (``/api/v1/jobs/{job_id}``, not the
    id itself, so that the number of series stays bounded)."""
    start = time.perf_counter()
    response = await call_next(request)
    route = request.scope.get("route")
    template = getattr(route, "path", None) or (
        "/static" if request.url.path.startswith("/static/") else "other"
    )
    HTTP_REQUESTS.labels(request.method, template, str(response.status_code)).inc()
    HTTP_LATENCY.labels(template).observe(time.perf_counter() - start)
    return response
