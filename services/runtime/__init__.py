"""microco.services.runtime: the one gRPC service lifecycle every microco server runs on.

:class:`ServiceRuntime` binds gRPC with health, reflection and the ``InfoService``, maps the
error tree to status codes, serves Prometheus ``/metrics`` and registers the instance in etcd
under a lease; :func:`run_service` is every service's ``main()``; :class:`ServiceSettings` are
its validated flags and ``MICROCO_*`` environment; :func:`start_service` and
:func:`stop_process` the one way a service is launched as a local process. Servers only: client code never imports it.
"""

from .launch import LaunchError, kill_after, start_service, stop_process, wait_until
from .server import ServiceContext, ServiceRuntime, run_service
from .settings import ServiceSettings, add_common_flags, settings_from_args

__all__ = [
    "LaunchError",
    "ServiceContext",
    "ServiceRuntime",
    "ServiceSettings",
    "add_common_flags",
    "kill_after",
    "run_service",
    "settings_from_args",
    "start_service",
    "stop_process",
    "wait_until",
]
