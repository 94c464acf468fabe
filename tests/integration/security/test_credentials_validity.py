"""Credentials out of their validity, as an operator meets them (session 40's held-out round):
expired (an administrator's file a year old, a job's after 30 days) or not yet valid (a clock
stepped back) read "cannot reach etcd ... connection failed", every server refusing them in the
TLS handshake, as if etcd were down; so did another CA's. Now the client says which credentials,
why, and what to do; `microco up` renews an administrator's file that has expired or soon will."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from microco.common import identity
from microco.common.errors import FailedPrecondition
from microco.common.identity import CertificateAuthority, check_valid, local_ca

pytestmark = pytest.mark.integration

MICROCO = [sys.executable, "-m", "microco.cli"]


def job_list(etcd: str, credentials: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MICROCO_CREDENTIALS_PEM", "MICROCO_INSECURE")}
    env["MICROCO_CREDENTIALS"] = str(credentials)
    return subprocess.run(
        [*MICROCO, "job", "list", "--etcd", etcd],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_expired_and_foreign_credentials_say_so(etcd_endpoint, tmp_path):
    ca = local_ca()
    assert ca is not None
    expired = ca.issue("user:old", days=0).write(tmp_path / "old.pem")  # valid until now
    foreign = CertificateAuthority.create().issue("user:stranger").write(tmp_path / "stranger.pem")
    time.sleep(1.1)
    out = job_list(etcd_endpoint, expired)
    assert out.returncode != 0
    assert f"the credentials in {expired} (user:old) expired at" in out.stderr, out.stderr
    out = job_list(etcd_endpoint, foreign)
    assert out.returncode != 0
    assert "refused this process's certificate, user:stranger" in out.stderr, out.stderr
    assert "platform's CA" in out.stderr


def test_credentials_not_yet_valid_name_the_clock():
    ca = local_ca()
    assert ca is not None
    ident = ca.issue("user:early")
    start, end = identity.validity(ident.cert_pem)
    assert check_valid(ident, "x", now=start + 1) is ident
    with pytest.raises(FailedPrecondition, match="not valid before .* is the clock right"):
        check_valid(ident, "x", now=start - 3600)  # the clock stepped back an hour
    with pytest.raises(FailedPrecondition, match="expired at"):
        check_valid(ident, "x", now=end + 1)


def test_up_renews_the_administrators_expiring_credentials(tmp_path, monkeypatch):
    from microco.common.hotstate import ENV_REDIS_PASSWORD
    from microco.services.stack._pki import StackPki

    home = tmp_path / "home"
    monkeypatch.delenv(identity.ENV_CA_DIR, raising=False)
    monkeypatch.setenv(ENV_REDIS_PASSWORD, "")
    monkeypatch.setattr(identity, "use", lambda ident: None)
    StackPki.set_up(home, False, lambda msg: None)
    admin = home / "credentials.pem"
    ca = CertificateAuthority.load(home / "pki")
    old = ca.issue(identity.Identity.from_pem(admin.read_bytes()).name, admin=True, days=10).write(admin)
    before = old.read_bytes()
    StackPki.set_up(home, False, lambda msg: None)  # within 30 days of expiring: renewed
    renewed = identity.Identity.from_pem(admin.read_bytes())
    assert admin.read_bytes() != before and renewed.admin
    assert identity.validity(renewed.cert_pem)[1] > time.time() + 300 * 86400
