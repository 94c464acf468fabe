"""Job profiles keyed by what a job is, so a job submitted again starts with what was learned.

A profile holds what the scheduler measured of earlier jobs of the same identity: the fastest
mini-batch time alone (per device count), the busy fraction of its devices alone (what
gandiva's packing reads) and the device count past which growing stopped paying. A new job
whose own measurements are still missing is shown to the policy with the profile's, so it is
packed, time-sliced or grown on facts rather than trial-packed as a stranger.

The identity (:func:`job_identity`) is the spec's ``model`` when the user names one; otherwise
the command with its output and platform-address arguments left out (``--out run-3.json``,
``--checkpoint-dir``, ``--etcd 127.0.0.1:2379``: two runs of one script differ there and are
the same job) and every small file it names (the script, a config) replaced by a hash of its
content, so an edited script is a new job and a moved one is not. Files are read where the
scheduler runs (relative paths under the job's ``workdir``); one it cannot read counts by its
path. The identity is computed once, when the leader first sees the job, and kept in the
record (``profile``) with a line in the job's history saying what is known or why nothing is.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from microco.common.errors import MicrocoError
from microco.common.kv import KV

from ._record import JobRecord, JobSpec, ProfileRef

log = logging.getLogger(__name__)

PROFILES_PREFIX = "/microco/scheduler/profiles/"
REFRESH_S = 30.0  # how often profiles written by another leader are read again
MAX_HASHED_BYTES = 1 << 20  # files up to this size count by content, larger ones by path

# Options whose value says where a run writes (or which platform it talks to), not what it is.
_WHERE = re.compile(
    r"^(o|out|outdir|output|outputs|output_dir|output_path|out_dir|out_file|output_file|save|save_dir|"
    r"save_path|checkpoint|checkpoints|checkpoint_dir|checkpoint_path|ckpt|ckpt_dir|ckpt_path|log|logs|"
    r"logdir|log_dir|log_file|tensorboard|tensorboard_dir|tb_dir|result|results|results_dir|run_dir|"
    r"export|export_dir|etcd|redis|home)$"
)


def _option(arg: str) -> str | None:
    """``--output-dir=x`` / ``--output-dir`` -> ``output_dir``; None for a non-option."""
    if not arg.startswith("-") or arg in ("-", "--") or _is_number(arg):
        return None
    return arg.lstrip("-").split("=", 1)[0].replace("-", "_").lower()


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _file_digest(arg: str, workdir: str) -> str | None:
    path = Path(arg)
    if not path.is_absolute():
        if not workdir:
            return None
        path = Path(workdir) / path
    try:
        if not path.is_file() or path.stat().st_size > MAX_HASHED_BYTES:
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def job_identity(spec: JobSpec | Mapping[str, Any]) -> tuple[str, str]:
    """(key, description) of what the job is (see the module doc)."""
    if isinstance(spec, JobSpec):
        spec = spec.to_dict()
    model = str(spec.get("model") or "")
    if model:
        text, described = f"model\0{model}", f"model {model}"
    else:
        command = [str(c) for c in spec.get("command") or []]
        kept: list[str] = [os.path.basename(command[0])] if command else []
        shown: list[str] = list(kept)
        skip_value = False
        for arg in command[1:]:
            if skip_value:
                skip_value = False
                if not arg.startswith("-") or _is_number(arg):
                    continue
            name = _option(arg)
            if name is not None and _WHERE.match(name):
                skip_value = "=" not in arg
                continue
            digest = None if name is not None else _file_digest(arg, str(spec.get("workdir") or ""))
            if digest:
                kept.append(f"{os.path.basename(arg)}#{digest}")
                shown.append(os.path.basename(arg))
            else:
                kept.append(arg)
                shown.append(arg)
        text = "cmd\0" + "\0".join(kept)
        described = "command " + " ".join(shown)
        if len(described) > 120:
            described = described[:117] + "..."
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return key, described


class Profiles:
    """The profiles in etcd (under ``PROFILES_PREFIX``), cached by the leader."""

    def __init__(self, kv: KV, clock: Callable[[], float]) -> None:
        self.kv, self.clock = kv, clock
        self._cache: dict[str, dict[str, Any]] = {}
        self._read_at: float | None = None

    # ------------------------------------------------------------------ store
    def refresh(self, now: float) -> None:
        """Read the profiles another leader wrote (now and then: they change slowly)."""
        if self._read_at is not None and now - self._read_at <= REFRESH_S:
            return
        self._read_at = now
        try:
            stored = self.kv.get_prefix_json(PROFILES_PREFIX)
        except MicrocoError as exc:
            log.warning("profiles not read: %s", exc)
            return
        for key, value in stored:
            if isinstance(value, dict) and "identity" in value:  # older entries had no identity
                self._cache.setdefault(key.removeprefix(PROFILES_PREFIX), value)

    def get(self, rec: JobRecord) -> dict[str, Any] | None:
        return self._cache.get(self._key(rec))

    def _key(self, rec: JobRecord) -> str:
        return (rec.profile.key if rec.profile else "") or job_identity(rec.spec)[0]

    def _write(self, key: str, prof: dict[str, Any]) -> None:
        self._cache[key] = prof
        try:
            self.kv.put_json(PROFILES_PREFIX + key, prof)
        except MicrocoError as exc:  # kept in memory; written with the next change
            log.warning("profile %s not written: %s", key, exc)

    def _entry(self, rec: JobRecord) -> tuple[str, dict[str, Any]]:
        key = self._key(rec)
        prof = dict(self._cache.get(key) or {})
        if not prof:
            prof = {"identity": (rec.profile.identity if rec.profile else "") or job_identity(rec.spec)[1]}
            prof.update(minibatch_ms={}, utilization=None, max_useful_devices=None, jobs=[])
        jobs = [j for j in prof.get("jobs") or [] if j != rec.id]
        prof["jobs"] = (jobs + [rec.id])[-10:]
        prof["at"] = self.clock()
        return key, prof

    # ------------------------------------------------------------------ learning
    def identify(self, rec: JobRecord, now: float) -> JobRecord:
        """Give a job seen for the first time its identity, and say in its history what its
        profile tells the policy, or why it has none."""
        if rec.profile or rec.terminal:
            return rec
        key, described = job_identity(rec.spec)
        rec = replace(rec, profile=ProfileRef(key, described))
        prof = self._cache.get(key)
        if prof is None:
            return rec.noted(
                f"no profile yet for {described}: the first job of its kind, measured once it "
                "runs 5 mini-batches alone",
                now,
            )
        return rec.noted(f"profile of {described} from earlier jobs: {describe(prof)}", now)

    def learn_alone(self, rec: JobRecord) -> None:
        """The job's own alone measurements (``minibatch_ms_alone``, ``utilization``) into its
        profile, when they improve on it (fastest time) or are new (latest utilisation)."""
        ms = float(rec.minibatch_ms_alone or 0.0)
        if ms <= 0:
            return
        n = str(max(1, len(rec.devices) or rec.spec.devices))
        old = self._cache.get(self._key(rec)) or {}
        old_ms = (old.get("minibatch_ms") or {}).get(n)
        util = rec.utilization
        if old_ms is not None and ms >= 0.9 * old_ms and (util is None or util == old.get("utilization")):
            return
        key, prof = self._entry(rec)
        times = dict(prof.get("minibatch_ms") or {})
        times[n] = ms if old_ms is None else min(ms, old_ms)
        prof["minibatch_ms"] = times
        if util is not None:
            prof["utilization"] = util
        self._write(key, prof)

    def learn_max_useful(self, rec: JobRecord) -> None:
        """A grow that did not pay: later jobs of this identity are not grown that far."""
        n = rec.max_useful_devices
        old = self._cache.get(self._key(rec)) or {}
        if not n or old.get("max_useful_devices") == n:
            return
        key, prof = self._entry(rec)
        prof["max_useful_devices"] = int(n)
        self._write(key, prof)

    # ------------------------------------------------------------------ the policy's view
    def fill_view(self, rec: JobRecord, view: dict[str, Any]) -> None:
        """What the job has not measured itself yet, from its profile."""
        prof = self.get(rec)
        if not prof:
            return
        if not view.get("minibatch_ms_alone"):
            n = len(rec.devices) if rec.holding and rec.devices else rec.spec.devices
            ms = (prof.get("minibatch_ms") or {}).get(str(n))
            if ms:
                view["minibatch_ms_alone"] = float(ms)
        if view.get("utilization") is None and prof.get("utilization") is not None:
            view["utilization"] = float(prof["utilization"])
        if view.get("max_useful_devices") is None and prof.get("max_useful_devices"):
            view["max_useful_devices"] = int(prof["max_useful_devices"])


def describe(prof: dict[str, Any]) -> str:
    """``12.3 ms per mini-batch alone on 1 device, 45% busy (2 jobs)``."""
    parts = [
        f"{float(ms):.1f} ms per mini-batch alone on {n} device{'' if n == '1' else 's'}"
        for n, ms in sorted((prof.get("minibatch_ms") or {}).items(), key=lambda kv: int(kv[0]))
    ]
    if prof.get("utilization") is not None:
        parts.append(f"{100 * float(prof['utilization']):.0f}% busy alone")
    if prof.get("max_useful_devices"):
        parts.append(f"growing to {prof['max_useful_devices']} devices did not pay")
    jobs = len(prof.get("jobs") or [])
    text = ", ".join(parts) or "nothing measured yet"
    return f"{text} ({jobs} job{'' if jobs == 1 else 's'})"
