"""Run the bundled etcd or Redis in the foreground (containers and Kubernetes use this, so every
image and command of the deployment comes from this repository):

    python -m microco.services.stack etcd --host 0.0.0.0 --port 2379 --advertise-host etcd --data-dir /data
    python -m microco.services.stack redis --host 0.0.0.0 --port 6379 --data-dir /data
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._servers import EtcdServer, RedisServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m microco.services.stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("server", choices=["etcd", "redis"])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer-port", type=int, default=2380, help="etcd only")
    parser.add_argument("--advertise-host", default="", help="etcd only: the name clients dial")
    parser.add_argument("--data-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if args.server == "etcd":
        server: EtcdServer | RedisServer = EtcdServer(
            args.data_dir,
            host=args.host,
            port=args.port,
            peer_port=args.peer_port,
            advertise_host=args.advertise_host,
        )
    else:
        server = RedisServer(args.data_dir, host=args.host, port=args.port)
    cmd = server.command()
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
