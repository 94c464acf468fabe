"""The user a node agent runs its jobs as (``--run-as``).

A job must not read its agent's credentials (the agent's key acts as ``service:agent``), yet a
process can read every file of its own user. So an agent running as root starts each job as an
unprivileged user (by default each job a uid of its own from ``JOB_UIDS``, in the group of
``microco-job`` where the system has one, else the dedicated gid ``DEFAULT_JOB_UID``): the job
cannot read the agent's 0600 files, nor signal or trace the agent, nor another job (whose
environment holds its own credentials, and whose checkpoints and home are its uid's own). The directories a job needs (its control directory, checkpoint
directory and a home) are given to that user; the ones on the way there are opened to its group
for traversal only (0710), never for listing. An agent that does not run as root cannot change
user: it runs jobs as itself and says so loudly at start (docs/security.md)."""

from __future__ import annotations

import grp
import logging
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from microco.clients.scheduler import ControlChannel
from microco.common.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)

ENV_RUN_AS = "MICROCO_RUN_AS"
JOB_USER_NAME = "microco-job"
DEFAULT_JOB_UID = 64_000  # a uid no login uses, when the system has no ``microco-job`` user
#: ``auto``: the uids jobs run as, one per running job (a uid with a passwd entry is skipped, and
#: so is one any process of this host runs as). Jobs sharing one uid could read each other's
#: environment (``/proc/<pid>/environ``: a job's credentials), checkpoints and home, and signal
#: each other, whoever owned them (session 40).
JOB_UIDS = range(64_001, 65_000)
SELF = ("self", "")
#: The agent's credentials in its environment: never passed on to a job or to the zygote.
AGENT_ONLY = frozenset({"MICROCO_CREDENTIALS", "MICROCO_CREDENTIALS_PEM", "MICROCO_CA_DIR"})


@dataclass(frozen=True)
class JobUser:
    uid: int
    gid: int
    #: each job runs as a uid of its own from ``JOB_UIDS`` (in group ``gid``), not as ``uid``
    per_job: bool = False

    def __str__(self) -> str:
        if self.per_job:
            return f"a uid of its own ({JOB_UIDS.start}-{JOB_UIDS.stop - 1}) gid {self.gid}"
        return f"uid {self.uid} gid {self.gid}"

    def with_uid(self, uid: int) -> JobUser:
        return JobUser(uid, self.gid)


def host_uids() -> set[int]:
    """The real uids of every process of this host (``/proc``)."""
    out = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            # ``status``, not the directory's owner: a process that changed user without exec
            # (a job forked from the zygote) is not dumpable, and its directory is root's.
            with open(os.path.join(entry.path, "status"), "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        out.add(int(line.split()[1]))
                        break
        except (OSError, ValueError, IndexError):
            pass  # it ended meanwhile
    return out


def pick_job_uid(taken: set[int], after: int = 0) -> int:
    """A uid of ``JOB_UIDS`` for a new job: not in ``taken`` (this agent's running jobs), not a
    uid any process of this host runs as, without a passwd entry; the first such after
    ``after`` (round robin: a uid comes back to a job as late as possible)."""
    busy = taken | host_uids()
    n = len(JOB_UIDS)
    start = (after - JOB_UIDS.start + 1) % n if after in JOB_UIDS else 0
    for i in range(n):
        uid = JOB_UIDS[(start + i) % n]
        if uid in busy:
            continue
        try:
            pwd.getpwuid(uid)
            continue  # a user of this system
        except KeyError:
            return uid
    raise FailedPrecondition(f"every job uid ({JOB_UIDS.start}-{JOB_UIDS.stop - 1}) is in use on this host")


def resolve_run_as(spec: str, euid: int | None = None) -> JobUser | None:
    """The user jobs run as for ``--run-as spec``: ``auto`` (as root, ``microco-job`` or the
    dedicated ``DEFAULT_JOB_UID``; otherwise the agent's own user), ``self`` (the agent's own
    user: ``None``), a user name, or ``uid[:gid]``."""
    euid = os.geteuid() if euid is None else euid
    spec = spec.strip()
    if spec in SELF:
        return None
    if spec == "auto":
        if euid != 0:
            return None
        try:
            pw = pwd.getpwnam(JOB_USER_NAME)
            return JobUser(pw.pw_uid, pw.pw_gid, per_job=True)
        except KeyError:
            return JobUser(DEFAULT_JOB_UID, DEFAULT_JOB_UID, per_job=True)
    uid_s, _, gid_s = spec.partition(":")
    try:
        if uid_s.isdigit():
            uid = int(uid_s)
            gid = int(gid_s) if gid_s else _primary_gid(uid)
        else:
            pw = pwd.getpwnam(uid_s)
            uid = pw.pw_uid
            gid = (int(gid_s) if gid_s.isdigit() else grp.getgrnam(gid_s).gr_gid) if gid_s else pw.pw_gid
    except (KeyError, ValueError):
        raise InvalidArgument(f"--run-as {spec!r}: no such user or group (a name, or uid[:gid])") from None
    if uid == 0 or gid == 0:
        raise InvalidArgument(
            "--run-as must name an unprivileged user: a job as root could read the agent's key"
        )
    if euid != 0 and uid != euid:
        raise InvalidArgument(
            f"--run-as {spec!r}: only an agent running as root can run jobs as another user"
        )
    return None if uid == euid else JobUser(uid, gid)


def blocked(user: JobUser, paths: list[Path], own: list[Path]) -> str:
    """The first directory on the way to one of ``paths`` (or the file itself, when it is to be
    run: ``sys.executable``) that ``user`` may not pass; ``own``: directories the agent opens for
    it itself (``traversable``). '' when none."""
    for target in paths:
        target = target.resolve()
        parts = [*reversed(target.parents), target]
        for p in parts:
            if any(p == o or o in p.parents for o in own):
                break  # the agent's own: made traversable for the job
            try:
                st = p.stat()
            except FileNotFoundError:
                break  # made later, by the agent
            bits = (
                (st.st_mode >> 6)
                if st.st_uid == user.uid
                else (st.st_mode >> 3 if st.st_gid == user.gid else st.st_mode)
            )
            if not bits & 0o1:
                return str(p)
    return ""


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def warn_if_shared(user: JobUser | None, credentials: str = "") -> None:
    """Say loudly, at start, that jobs run as the agent's own user and may read its key."""
    if user is not None:
        log.info("jobs run as %s, apart from the agent (uid %d)", user, os.geteuid())
        return
    log.warning(
        "JOBS RUN AS THIS AGENT'S OWN USER (uid %d): a job can read the agent's credentials%s and act "
        "as service:agent. Run the agent as root to start each job as a separate user (--run-as, "
        "docs/security.md)",
        os.geteuid(),
        f" ({credentials})" if credentials else "",
    )


def traversable(path: Path, user: JobUser) -> None:
    """Let ``user``'s group pass through ``path`` (0710, group ``user.gid``): not list it, not read
    what it holds unless that is theirs. Directories of others are left as they are."""
    st = path.stat()
    if st.st_uid != os.geteuid():
        return
    if st.st_gid != user.gid:
        os.chown(path, -1, user.gid)
    mode = st.st_mode & 0o7777
    if mode & 0o070 != 0o010 or mode & 0o007:
        os.chmod(path, (mode & 0o700) | 0o010)


def give(path: Path, user: JobUser, mode: int = 0o700) -> None:
    """``path`` (a directory) becomes ``user``'s own, with everything in it (an earlier attempt
    of the job may have run as another uid)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, user.uid, user.gid)
    os.chmod(path, mode)
    _chown_tree(path, user.uid, user.gid)


def reclaim(paths: list[Path]) -> None:
    """Give a job's directories back to the agent once the job has exited: the uid it ran as
    goes to a later job, which must not find them its own."""
    uid, gid = os.geteuid(), os.getegid()
    for path in paths:
        try:
            os.chown(path, uid, gid, follow_symlinks=False)
        except OSError:
            continue  # gone (collected), or a shared root that refuses it
        _chown_tree(path, uid, gid)


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            try:
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
            except OSError:
                pass


class JobControl(ControlChannel):
    """The agent's end of a job's control directory when the job runs as another user: each
    command file is the job's own (written as the agent, given to the job before it is renamed
    into place, so the job never sees one it cannot read)."""

    def __init__(self, directory: str | os.PathLike[str], user: JobUser) -> None:
        super().__init__(directory)
        self.user = user
        self.file_owner = (user.uid, user.gid)
