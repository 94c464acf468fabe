"""The platform's PKI: issuing, reading credentials, where a process finds its own, and
`microco user add`."""

from __future__ import annotations

import stat

import pytest

from microco.common import identity
from microco.common.errors import FailedPrecondition, InvalidArgument
from microco.common.identity import CertificateAuthority, Identity


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


def test_issued_identities_read_back_with_their_kind_and_admin_flag(ca):
    alice = ca.issue("user:alice", admin=True)
    again = Identity.from_pem(alice.to_pem())
    assert (again.name, again.admin, again.kind, again.subject) == ("user:alice", True, "user", "alice")
    assert identity.peer_name(ca.issue("job:j-1").cert_pem) == ("job:j-1", False)
    assert again.ca_pem == ca.cert_pem


def test_only_service_certificates_name_the_service_host(ca):
    from cryptography import x509

    def sans(ident: Identity) -> list[str]:
        cert = x509.load_pem_x509_certificate(ident.cert_pem)
        try:
            ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        except x509.ExtensionNotFound:
            return []
        return ext.value.get_values_for_type(x509.DNSName)

    assert sans(ca.issue("service:cache")) == [identity.SERVICE_NAME]
    assert sans(ca.issue("user:bob")) == [] and sans(ca.issue("job:x")) == []


@pytest.mark.parametrize(
    "name", ["alice", "root:alice", "user:", "user:a/b", "user:a b", "user:" + "x" * 200]
)
def test_bad_identity_names_are_refused(ca, name):
    with pytest.raises(InvalidArgument):
        ca.issue(name)


def test_only_a_user_can_be_an_administrator(ca):
    with pytest.raises(InvalidArgument, match="only a user"):
        ca.issue("service:scheduler", admin=True)


def test_credentials_files_are_private_and_checked(ca, tmp_path):
    path = ca.issue("user:carol").write(tmp_path / "c.pem")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FailedPrecondition, match="certificate, its private key and the CA"):
        Identity.from_pem(ca.cert_pem)


def test_ca_directory_keeps_its_key_private_and_is_reused(tmp_path):
    first = CertificateAuthority.load_or_create(tmp_path / "pki")
    assert stat.S_IMODE((tmp_path / "pki" / identity.CA_KEY).stat().st_mode) == 0o600
    assert CertificateAuthority.load_or_create(tmp_path / "pki").cert_pem == first.cert_pem
    with pytest.raises(FailedPrecondition, match="microco up"):
        CertificateAuthority.load(tmp_path / "none")


def test_where_a_process_finds_its_credentials(ca, tmp_path, monkeypatch):
    monkeypatch.setattr(identity, "_used", None)
    monkeypatch.delenv(identity.ENV_CREDENTIALS_PEM, raising=False)
    monkeypatch.setenv(identity.ENV_CREDENTIALS, str(ca.issue("user:dan").write(tmp_path / "d.pem")))
    assert identity.current().name == "user:dan"
    monkeypatch.setenv(identity.ENV_CREDENTIALS_PEM, ca.issue("job:j-9").to_pem().decode())
    assert identity.current().name == "job:j-9"
    monkeypatch.delenv(identity.ENV_CREDENTIALS_PEM)
    monkeypatch.setenv(identity.ENV_CREDENTIALS, str(tmp_path / "missing.pem"))
    with pytest.raises(FailedPrecondition, match="microco user add"):
        identity.current()
    monkeypatch.setenv(identity.ENV_INSECURE, "1")
    assert identity.current() is None and identity.service_identity("x") is None


def test_a_service_issues_itself_from_the_ca_it_is_given(tmp_path, monkeypatch):
    CertificateAuthority.load_or_create(tmp_path / "ca")
    monkeypatch.setattr(identity, "_used", None)
    monkeypatch.setenv(identity.ENV_CA_DIR, str(tmp_path / "ca"))
    assert identity.service_identity("cache").name == "service:cache"
    assert identity.job_identity("j-1").name == "job:j-1"
    monkeypatch.setenv(identity.ENV_CA_DIR, "")
    monkeypatch.setenv(identity.ENV_CREDENTIALS, str(tmp_path / "missing.pem"))
    with pytest.raises(FailedPrecondition):
        identity.service_identity("cache")
    assert identity.job_credentials_env("j-2") == {}  # no CA: a job runs without credentials


def test_user_add_writes_a_users_credentials(tmp_path, monkeypatch, capsys):
    from microco.cli import main

    monkeypatch.delenv(identity.ENV_CA_DIR, raising=False)
    CertificateAuthority.load_or_create(tmp_path / "pki")
    assert main(["user", "add", "erin", "--home", str(tmp_path)]) == 0
    path = tmp_path / "users" / "erin.pem"
    assert f"export MICROCO_CREDENTIALS={path}" in capsys.readouterr().out
    ident = Identity.from_pem(path.read_bytes())
    assert (ident.name, ident.admin) == ("user:erin", False)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert main(["user", "add", "erin", "--home", str(tmp_path)]) == 1  # exists: --force replaces
    assert main(["user", "add", "erin", "--admin", "--force", "--home", str(tmp_path)]) == 0
    assert Identity.from_pem(path.read_bytes()).admin
    assert main(["user", "add", "a/b", "--home", str(tmp_path)]) == 1
    assert "may not" in capsys.readouterr().err


def test_a_private_ca_for_a_block_leaves_the_process_as_it_was(tmp_path, monkeypatch):
    """Session 30 (noticed in session 29): a benchmark that starts a cluster under a directory
    it removes named its CA there for the rest of the process (``MICROCO_CA_DIR``, the CA cached
    by directory), so a second cluster in the same process was handed the first's, its
    directory gone. ``private_ca_scope`` names its CA for the block only: a second block gets a
    CA of its own, and after both the variable and the identity are what they were."""
    import shutil

    monkeypatch.delenv(identity.ENV_CA_DIR, raising=False)
    monkeypatch.delenv(identity.ENV_INSECURE, raising=False)
    monkeypatch.setattr(identity, "_used", None)
    seen = []
    for name in ("first", "second"):
        with identity.private_ca_scope(tmp_path / name) as ca:
            assert identity.local_ca().cert_pem == ca.cert_pem  # the block's own, named
            assert identity.current().ca_pem == ca.cert_pem and identity.current().admin
            seen.append(ca.cert_pem)
        shutil.rmtree(tmp_path / name)  # as the benchmark removes its directory
        assert identity.ENV_CA_DIR not in __import__("os").environ and identity._used is None
    assert seen[0] != seen[1]


def test_a_restarted_job_never_gets_expired_or_revoked_credentials_again(monkeypatch):
    """Session 41: the CA kept every identity it issued, by name, for the life of its process
    (the scheduler's), and handed it out again: a job restarted (migrated, requeued, resumed)
    31 days after its first start got its first, expired, 30-day certificate, refused by every
    service and by its own client; one whose certificate an operator revoked got it again after
    the revocation, refused for ever. A kept identity is handed out only while it is in the first
    half of its life and not revoked; what is kept is bounded."""
    import datetime
    import time

    ca = CertificateAuthority.create()
    first = ca.issue("job:long", days=30)
    assert ca.issue("job:long", days=30) is first  # kept while young
    real = datetime.datetime

    class _Later(real):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def]
            return cls.fromtimestamp(real.now(tz).timestamp() + 31 * 86400, tz)

    monkeypatch.setattr(datetime, "datetime", _Later)
    try:
        later = ca.issue("job:long", days=30)
    finally:
        monkeypatch.setattr(datetime, "datetime", real)
    assert later.cert_pem != first.cert_pem
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(later.cert_pem)
    assert cert.not_valid_after_utc > real.now(datetime.timezone.utc) + datetime.timedelta(days=59)
    # revoked after it was issued: the next start gets a new certificate, which is not revoked
    job = ca.issue("job:leaked")
    identity.set_revoked({"job:leaked": time.time()})
    try:
        time.sleep(1.1)  # a certificate carries whole seconds
        again = ca.issue("job:leaked")
        assert again.cert_pem != job.cert_pem
        assert identity.revoked("job:leaked", job.cert_pem) and not identity.revoked(
            "job:leaked", again.cert_pem
        )
    finally:
        identity.set_revoked({})
    # a shorter life asked for is not answered with a longer one kept
    short = ca.issue("user:brief", days=1)
    assert ca.issue("user:brief", days=0).cert_pem != short.cert_pem
    for i in range(2000):  # what the CA keeps is bounded
        ca.issue(f"job:many-{i}")
    assert len(ca._issued) <= 1024
