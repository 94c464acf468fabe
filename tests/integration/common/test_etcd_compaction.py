"""The platform's etcd compacts its history (session 42's held-out round, an operator's fault).
etcd keeps every revision of every key until it is compacted, and nothing compacted it: the
scheduler rewrites each running job's record every tick (0.5 s), so etcd's database grew by a
record's size twice a second per running job until it reached its quota (512 MiB on the local
stack, 2 GiB in compose), after which etcd refused every write (``database space exceeded``) and
the platform stopped. The stack's etcd (Kubernetes runs the same) and compose's now keep
ten minutes of history; here a short one, on a real etcd, shows old revisions go."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _support import wait_until

from microco.common.kv import EtcdKV
from microco.services.stack import EtcdServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _flag(command: list[str], name: str) -> str:
    assert name in command, command
    return command[command.index(name) + 1]


def test_the_platforms_etcd_compacts_its_history(tmp_path):
    server = EtcdServer(tmp_path / "etcd")
    command = server.command()
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["etcd"]["command"]
    for flags in (command, compose):
        assert _flag(flags, "--auto-compaction-mode") == "periodic"
        assert _flag(flags, "--auto-compaction-retention") == "10m"

    server.compaction_retention = "1s"
    with server:
        kv = EtcdKV(server.endpoint)
        try:
            client = kv._client
            first = client.put("/microco/test/record", b"x" * 1000).header.revision
            for _ in range(20):  # a record rewritten, as a running job's every tick
                client.put("/microco/test/record", b"y" * 1000)

            def compacted() -> bool:
                client.put("/microco/test/record", b"z" * 1000)  # periodic compaction needs new revisions
                try:
                    client.get_response("/microco/test/record", revision=first)
                except Exception as exc:  # noqa: BLE001 - pyetcd's error for a compacted revision
                    return "compacted" in str(exc)
                return False

            wait_until(compacted, 60, "etcd to compact the record's old revisions", interval=0.5)
        finally:
            kv.close()
