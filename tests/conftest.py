"""Shared fixtures. Integration tests get a real etcd and a real Redis, started once per session
on free ports with temporary data directories (the same server classes ``microco up`` uses)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Keep the frameworks polite on a 2-core machine shared by the suite.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")


def _session_pki() -> None:
    """The suite runs secure, as the platform does by default: one CA for the session (shared
    with xdist workers through the environment), ``MICROCO_CA_DIR`` so every service a test
    starts issues itself ``service:<name>`` and the scheduler its jobs' credentials, and an
    administrator's credentials for the tests' own clients. Only tests about the insecure
    development flag turn it on (``monkeypatch``)."""
    import atexit
    import shutil
    import tempfile

    from microco.common.identity import CertificateAuthority

    for var in ("MICROCO_INSECURE", "MICROCO_CREDENTIALS_PEM"):
        os.environ.pop(var, None)
    root = os.environ.get("MICROCO_TEST_PKI", "")
    if not root or not Path(root, "ca", "ca.key").exists():
        root = tempfile.mkdtemp(prefix="microco-test-pki-")
        os.environ["MICROCO_TEST_PKI"] = root
        atexit.register(shutil.rmtree, root, True)
        ca = CertificateAuthority.load_or_create(Path(root, "ca"))
        ca.issue("user:tester", admin=True).write(Path(root, "tester.pem"))
    os.environ["MICROCO_CA_DIR"] = str(Path(root, "ca"))
    os.environ["MICROCO_CREDENTIALS"] = str(Path(root, "tester.pem"))
    # Agents the tests start run jobs as the tests' own user: a test's data and working folders
    # are under pytest's 0700 temporary directory, which a separate job user (what an agent
    # running as root picks by default, where that user can reach the interpreter) cannot read.
    # The separation itself is tested with an explicit user: tests/integration/security/test_job_user.py.
    os.environ.setdefault("MICROCO_RUN_AS", "self")


_session_pki()


@pytest.fixture(scope="session", autouse=True)
def _private_xla_rate_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Astra's TensorFlow side learns XLA's compile rate per machine in a file under the home
    directory; the suite must neither read a developer's learned rate (it changes which choices
    are tried) nor leave one behind."""
    old = os.environ.get("MICROCO_XLA_COST_FILE")
    os.environ["MICROCO_XLA_COST_FILE"] = str(tmp_path_factory.mktemp("xla") / "rate.json")
    yield
    if old is None:
        os.environ.pop("MICROCO_XLA_COST_FILE", None)
    else:
        os.environ["MICROCO_XLA_COST_FILE"] = old


@pytest.fixture(autouse=True)
def _no_telemetry_stream_left() -> Iterator[None]:
    """No test leaves the process a job-side telemetry stream (``microco.clients.telemetry``):
    it is held weakly, but a hook a test dropped unfinished stays current while anything still
    holds it (a failed test's traceback, a cycle not yet collected), and a later test's library
    in the same worker then waits for records that never come (CI, session 40: AstraTorch's
    probe steps went unrecorded, and tests reading the probe after one step found none)."""
    yield
    from microco.clients import telemetry

    stream = telemetry.current()
    if stream is not None:
        telemetry.uninstall(stream)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from microco.services.stack import EtcdServer

    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_server: object) -> str:
    return etcd_server.endpoint  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from microco.services.stack import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: object) -> str:
    return redis_server.url  # type: ignore[attr-defined]


@pytest.fixture
def etcd_kv(etcd_endpoint: str) -> Iterator[object]:
    """An ``EtcdKV`` on the session's etcd. Keys are not namespaced, so services started by the
    test see the same keys; each test cleans the ``/microco/`` tree afterwards."""
    from microco.common.kv import EtcdKV

    kv = EtcdKV(etcd_endpoint)
    kv.delete_prefix("/microco/")
    yield kv
    kv.delete_prefix("/microco/")
    kv.close()


@pytest.fixture
def namespaced_kv(etcd_endpoint: str) -> Iterator[object]:
    """An ``EtcdKV`` whose keys live under a fresh prefix, isolated from every other test."""
    from microco.common.kv import EtcdKV

    ns = f"/test-{uuid.uuid4().hex[:8]}"
    kv = EtcdKV(etcd_endpoint, namespace=ns)
    yield kv
    kv.delete_prefix("")
    kv.close()


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 4 MiB file system of its own (a tmpfs), for a full disk under a service's data; unmounted
    afterwards. Skips where it cannot be mounted (needs root with CAP_SYS_ADMIN)."""
    import subprocess
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="microco-small-disk-"))
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True, check=False).returncode != 0:
        where.rmdir()
        pytest.skip("cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests keep what a person may want to look at afterwards (screenshots, plots)."""
    path = REPO / "test-artifacts"
    path.mkdir(exist_ok=True)
    return path


_HEAVY_FIRST = ("slow", "e2e", "tensorflow", "torch", "integration")


def _weight(item: pytest.Item) -> int:
    """Lower runs earlier: slow files, end-to-end, the frameworks' (their imports alone take
    seconds), integration, then the rest."""
    for rank, mark in enumerate(_HEAVY_FIRST):
        if item.get_closest_marker(mark) is not None:
            return rank
    return len(_HEAVY_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heaviest files first. The suite runs a file per worker at a time (``--dist loadfile``,
    ``--no-loadscope-reorder`` in the Makefile); a minute-long file dealt last keeps one worker
    busy while the other idles, so the long files are dealt first and the many short ones fill
    in behind them. A stable sort: the order within a file, and among equals, is kept."""
    file_weight: dict[str, int] = {}
    for item in items:
        path = str(item.path)
        file_weight[path] = min(file_weight.get(path, len(_HEAVY_FIRST)), _weight(item))
    items.sort(key=lambda item: file_weight[str(item.path)])


# Files that import TensorFlow into the worker itself (~8 CPU-s a worker). Under ``--dist
# loadfile`` each file went to whichever worker was free, so every worker paid the import; dealt
# as one unit, one worker does (docs/testing.md, "TensorFlow in one worker").
ONE_WORKER = {
    "tensorflow-in-process": (
        "tests/unit/compiler/test_compiler_tf.py",
        "tests/unit/compiler/test_compiler_tf_cost.py",
        "tests/unit/compiler/test_compiler_tf_graph.py",
        "tests/unit/compiler/test_compiler_bench.py",
        "tests/unit/compiler/test_compiler_corpus.py",
        "tests/integration/cache/test_cache_frameworks.py",
    ),
}
_UNIT_OF = {path: unit for unit, paths in ONE_WORKER.items() for path in paths}


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile``, except that the files of an ``ONE_WORKER`` entry are one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return _UNIT_OF.get(path, path)

    return Scheduling(config, log)
