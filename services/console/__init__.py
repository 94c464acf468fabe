"""The microco admin console: a REST API (OpenAPI published at ``/api/v1/openapi.json``) and a web
page an operator leaves open, over what the platform's services expose.

It reads state from etcd and Redis and acts only through the services' gRPC APIs. Every endpoint
except ``/healthz`` and ``/readyz`` needs a bearer token; changes need the admin token; the default
development token is refused outside the ``dev`` profile.
"""

from ._app import STATIC_DIR, create_app
from ._config import DEFAULT_DEV_TOKEN, TOKEN_ENV, VIEW_TOKEN_ENV, ConsoleConfig
from ._server import ConsoleServer, main
from ._timeline import hit_rate_series, job_timeline

__all__ = [
    "DEFAULT_DEV_TOKEN",
    "STATIC_DIR",
    "TOKEN_ENV",
    "VIEW_TOKEN_ENV",
    "ConsoleConfig",
    "ConsoleServer",
    "create_app",
    "hit_rate_series",
    "job_timeline",
    "main",
]
