"""microco.services.runtime: the one gRPC service lifecycle every microco server runs on.

:class:`ServiceRuntime` binds gRPC with health, reflection and the ``InfoService``, maps the
error tree to status codes, serves Prometheus ``/metrics`` and registers the instance in etcd
under a lease; :func:`run_service` is every service's ``main()``; :class:`ServiceSettings` are
its validated flags and ``MICROCO_*`` environment. Servers only: client code never imports it.
"""

from .server import ServiceContext, ServiceRuntime, run_service
from .settings import ServiceSettings, add_common_flags, settings_from_args

__all__ = [
    "ServiceContext",
    "ServiceRuntime",
    "ServiceSettings",
    "add_common_flags",
    "run_service",
    "settings_from_args",
]
