"""The local stack: real etcd and Redis plus every microco service on one machine
(``microco up`` / ``microco down`` / ``microco status``), and the same servers for test fixtures."""

from microco.common.health import check_health

from ._pki import ca_dir as stack_ca_dir
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
    "EtcdServer",
    "ProcessSpec",
    "RedisServer",
    "Stack",
    "StackOptions",
    "any_alive",
    "check_health",
    "default_home",
    "free_port",
    "platform_processes",
    "port_open",
    "read_state",
    "stack_ca_dir",
    "stop_from_state",
]
