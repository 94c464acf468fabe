"""The local stack: real etcd and Redis plus every microco service on one machine
(``microco up`` / ``microco down`` / ``microco status``), and the same servers for test fixtures."""

from microco.common.health import check_health

from ._pki import ca_dir as stack_ca_dir
from ._pki import console_token_file
from ._policy import DEFAULT_POLICY, resolve_policy, scheduler_args
from ._servers import EtcdServer, RedisServer, free_port, port_open
from ._supervisor import (
    ProcessSpec,
    Stack,
    StackOptions,
    any_alive,
    default_home,
    platform_processes,
    read_state,
    stop_from_state,
)

__all__ = [
    "DEFAULT_POLICY",
    "EtcdServer",
    "ProcessSpec",
    "RedisServer",
    "Stack",
    "StackOptions",
    "any_alive",
    "check_health",
    "console_token_file",
    "default_home",
    "free_port",
    "platform_processes",
    "port_open",
    "read_state",
    "resolve_policy",
    "scheduler_args",
    "stack_ca_dir",
    "stop_from_state",
]
