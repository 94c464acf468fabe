"""Data at rest (issue 16): the stack's home, its PKI, logs and data directories are its
owner's alone (0700), credentials and secrets files 0600, and every process the stack starts
runs with umask 077, so what a service writes (store extents, etcd's and Redis's data, logs)
is readable by the stack's owner only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from microco.common import identity
from microco.common.hotstate import ENV_REDIS_PASSWORD

pytestmark = pytest.mark.integration


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_stacks_home_pki_and_credentials_are_private(tmp_path, monkeypatch):
    from microco.services.stack._pki import StackPki, job_user

    home = tmp_path / "home"
    home.mkdir(mode=0o755)  # an existing home is made private too
    monkeypatch.delenv(identity.ENV_CA_DIR, raising=False)  # the stack's own CA, in <home>/pki
    monkeypatch.setenv(ENV_REDIS_PASSWORD, "")  # set_up sets it for this process: restored after
    monkeypatch.setattr(identity, "use", lambda ident: None)  # keep this process's identity
    pki = StackPki.set_up(home, False, lambda msg: None)
    pki.child_env("cache-0", "cache")
    job = job_user()  # as root: the jobs' own user, whose group passes through home and data
    for d in (home, home / "logs", home / "data", home / "pki", home / "pki" / "services"):
        if job is not None and d in (home, home / "data"):
            assert mode(d) == 0o710 and d.stat().st_gid == job.gid, d
        else:
            assert mode(d) == 0o700, d
    secrets = [
        home / "credentials.pem",
        home / "pki" / "redis.password",
        home / "pki" / "services" / "cache-0.pem",
    ]
    secrets += [p for p in (home / "pki").rglob("*key*") if p.is_file()]
    assert len(secrets) >= 4
    for f in secrets:
        assert mode(f) == 0o600, f


def test_what_a_stack_service_writes_is_its_owners_alone(tmp_path):
    from microco.services.runtime.launch import start_service
    from microco.services.stack._pki import PRIVATE_UMASK
    from microco.services.store._nodestore import NodeStore

    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text("{}")
    log = tmp_path / "logs" / "tool.log"
    proc = start_service("json.tool", [str(src), str(out)], log_path=log, umask=PRIVATE_UMASK)
    assert proc.wait(timeout=60) == 0
    assert mode(out) == 0o600 and mode(log) == 0o600
    # a store node's data directory is private whoever starts it
    NodeStore("n", tmp_path / "node")
    assert mode(tmp_path / "node") == 0o700


def test_the_stacks_etcd_and_redis_keep_their_data_private(etcd_server, redis_server):
    for server in (etcd_server, redis_server):
        data = Path(server.data_dir)  # type: ignore[attr-defined]
        assert mode(data) == 0o700, data
        for p in data.rglob("*"):
            if p.is_file():
                assert mode(p) & 0o077 == 0, p


def test_the_stacks_console_has_a_token_of_its_own(tmp_path, monkeypatch, capsys):
    # Session 40: `microco up` ran its console on the well-known development token, so any local
    # user, and any job (the console listens on loopback, where jobs run), was the console's
    # administrator: submit jobs as anyone, cancel them, read every log and table.
    from microco.cli import main as cli_main
    from microco.services.console import DEFAULT_DEV_TOKEN, TOKEN_ENV
    from microco.services.stack._pki import StackPki

    home = tmp_path / "home"
    monkeypatch.delenv(identity.ENV_CA_DIR, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(identity.ENV_INSECURE, "")  # set_up(insecure=True) sets it: restored after
    monkeypatch.setenv(ENV_REDIS_PASSWORD, "")
    monkeypatch.setattr(identity, "use", lambda ident: None)
    for insecure in (False, True):
        pki = StackPki.set_up(home, insecure, lambda msg: None)
        token = pki.child_env("console", "console")[TOKEN_ENV]
        assert token != DEFAULT_DEV_TOKEN and len(token) >= 16
        assert pki.child_env("cache", "cache")[TOKEN_ENV] == ""  # the console's alone
        assert mode(home / "pki" / "console-token") == 0o600
    assert cli_main(["console", "token", "--home", str(home)]) == 0
    assert capsys.readouterr().out.strip() == token  # the same token, kept across starts
    monkeypatch.setenv(TOKEN_ENV, "an-operators-own-token")  # docs/console.md: kept
    pki = StackPki.set_up(home, False, lambda msg: None)
    assert pki.child_env("console", "console")[TOKEN_ENV] == "an-operators-own-token"
