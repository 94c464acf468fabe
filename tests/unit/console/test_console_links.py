"""One job's links (issue 21, "the console shows the links"): the pure joining of the scheduler's
job, the cache servers' per-job counters and the compiler's graphs on the job id; the compiler
keeping the jobs that registered a graph; and ``GET /api/v1/jobs/{id}/links`` in process with
stand-in clients answering real protobuf messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from microco.common.errors import NotFound, Unavailable
from microco.common.kv import MemoryKV
from microco.services.console import DEFAULT_DEV_TOKEN, ConsoleConfig, create_app
from microco.services.console._gateway import SYSTEMS
from microco.services.console._links import cache_links, compiler_links, job_links

ADMIN = {"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"}
VIEWER = {"Authorization": "Bearer viewer-token-123"}


def _stats(*entries: tuple[str, str, int, int, int]) -> dict[str, Any]:
    return {
        "hits": 1000,  # the server's totals: never the job's
        "misses": 1000,
        "job_stats": [
            {"job_id": j, "dataset": d, "hits": h, "misses": m, "bytes_served": b}
            for j, d, h, m, b in entries
        ],
    }


def test_cache_links_sum_one_jobs_counters_per_dataset_across_servers() -> None:
    servers = [
        {"instance_id": "c1", "stats": _stats(("j1", "imagenet", 30, 10, 4000), ("j2", "imagenet", 5, 5, 9))},
        {"instance_id": "c2", "stats": _stats(("j1", "imagenet", 10, 30, 1000), ("j1", "text", 0, 4, 0))},
        {"instance_id": "c3", "error": "connection refused"},
    ]
    out = cache_links("j1", servers)
    assert [d["dataset"] for d in out["datasets"]] == ["imagenet", "text"]
    img, text = out["datasets"]
    assert (img["hits"], img["misses"], img["bytes_served"], img["servers"]) == (40, 40, 5000, ["c1", "c2"])
    assert img["hit_rate"] == 0.5
    assert (text["hits"], text["misses"], text["hit_rate"]) == (0, 4, 0.0)
    assert (out["hits"], out["misses"], out["bytes_served"]) == (40, 44, 5000)
    assert out["hit_rate"] == pytest.approx(40 / 84)
    assert [(s["instance_id"], s["dataset"]) for s in out["servers"]] == [
        ("c1", "imagenet"),
        ("c2", "imagenet"),
        ("c2", "text"),
    ]
    # an unreadable server is named, not counted as zero hits
    assert out["errors"] == [{"instance_id": "c3", "error": "connection refused"}]


def test_cache_links_of_a_job_no_server_saw_are_empty_with_no_rate() -> None:
    out = cache_links("j9", [{"instance_id": "c1", "stats": _stats(("j1", "d", 3, 1, 10))}])
    assert out["datasets"] == [] and out["servers"] == []
    assert (out["hits"], out["misses"], out["hit_rate"]) == (0, 0, None)


def test_compiler_links_keep_the_graphs_the_job_registered_newest_first() -> None:
    graphs = [
        {"key": "a", "jobs": [{"job_id": "j1", "registered_at": 10.0, "committed": False}]},
        {"key": "b", "jobs": [{"job_id": "j2", "registered_at": 50.0}]},
        {
            "key": "c",
            "jobs": [
                {"job_id": "j2", "registered_at": 5.0},
                {"job_id": "j1", "registered_at": 20.0, "committed": True},
            ],
        },
        {"key": "d"},
    ]
    out = compiler_links("j1", graphs)
    assert [g["key"] for g in out] == ["c", "a"]
    assert out[0]["job"] == {"job_id": "j1", "registered_at": 20.0, "committed": True}
    assert compiler_links("j3", graphs) == []


def test_job_links_say_why_a_system_is_missing_rather_than_show_zero() -> None:
    job = {"id": "j1", "state": "running", "timeline": []}
    out = job_links(
        job,
        {"available": False, "reason": "cache: not available in this build", "servers": []},
        {
            "available": False,
            "reason": "compiler: no live instance",
            "graphs": [{"key": "x", "jobs": [{"job_id": "j1"}]}],
        },
    )
    assert out["job"] is job
    assert out["cache"] == {"available": False, "reason": "cache: not available in this build"}
    assert out["compiler"] == {"available": False, "reason": "compiler: no live instance", "graphs": []}
    both = job_links(
        job,
        {
            "available": True,
            "reason": "",
            "servers": [{"instance_id": "c", "stats": _stats(("j1", "d", 1, 1, 2))}],
        },
        {"available": True, "reason": "", "graphs": [{"key": "x", "jobs": [{"job_id": "j1"}]}]},
    )
    assert both["cache"]["hits"] == 1 and both["cache"]["hit_rate"] == 0.5
    assert [g["key"] for g in both["compiler"]["graphs"]] == ["x"]


# --------------------------------------------------------------------------- the compiler's side

compiler_in_build = SYSTEMS["compiler"].in_build()


@pytest.mark.skipif(not compiler_in_build, reason="the compiler is not part of this build")
def test_the_compiler_keeps_the_jobs_that_registered_a_graph() -> None:
    from microco.clients.compiler.explore import wire
    from microco.clients.compiler.explore._core import MAX_JOBS, Exploration
    from microco.clients.compiler.explore._store import CompilerCore
    from microco.clients.compiler.explore.types import GraphSpec, Variable

    spec = GraphSpec("fp", "[8,4]", "cpu", (Variable("fuse", ("off", "on")),), model_name="m")
    core = CompilerCore(MemoryKV())
    core.register(spec)  # outside a job: no job recorded
    assert core.get(spec.key).jobs == []
    core.register(spec, job_id="j1")
    core.register(spec, job_id="j2")
    core.register(spec, job_id="j1")  # again: once, moved to the end with its latest time
    state = core.get(spec.key)
    assert [j["job_id"] for j in state.jobs] == ["j2", "j1"]
    assert Exploration.from_json(state.to_json()).jobs == state.jobs  # kept in etcd with the state
    pb = wire.state_to_proto(state)
    assert [j.job_id for j in pb.jobs] == ["j2", "j1"]
    assert pb.jobs[1].registered_at >= pb.jobs[0].registered_at > 0
    for i in range(MAX_JOBS + 5):
        core.register(spec, job_id=f"k{i}")
    jobs = core.get(spec.key).jobs
    assert len(jobs) == MAX_JOBS and jobs[-1]["job_id"] == f"k{MAX_JOBS + 4}"


@pytest.mark.skipif(not compiler_in_build, reason="the compiler is not part of this build")
def test_the_remote_client_sends_the_job_id_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from microco.api.compiler.v1 import compiler_pb2
    from microco.clients.compiler import RemoteExplorer
    from microco.clients.compiler.explore.types import GraphSpec

    sent: list[Any] = []

    class _Stub:
        def RegisterGraph(self, req: Any, **kw: Any) -> Any:
            sent.append(req)
            return compiler_pb2.Config(key="k", committed=True, trial=-1)

    ex = RemoteExplorer.__new__(RemoteExplorer)
    ex._stub = _Stub()  # type: ignore[attr-defined]
    ex._call = lambda method, req, timeout=None, idempotent=False: method(req)  # type: ignore[method-assign]
    spec = GraphSpec("fp", "s", "cpu", ())
    monkeypatch.setenv("MICROCO_JOB_ID", "job-42")
    ex.register(spec)
    monkeypatch.delenv("MICROCO_JOB_ID")
    ex.register(spec)
    assert [r.job_id for r in sent] == ["job-42", ""]


# --------------------------------------------------------------------------- the endpoint


@pytest.fixture
def client() -> Iterator[TestClient]:
    if not all(SYSTEMS[s].in_build() for s in ("scheduler", "cache", "compiler")):
        pytest.skip("a system is not part of this build")
    from microco.api.cache.v1 import cache_pb2
    from microco.api.compiler.v1 import compiler_pb2
    from microco.api.scheduler.v1 import scheduler_pb2
    from microco.common import ServiceRecord

    job = scheduler_pb2.Job(
        id="j1", state=scheduler_pb2.JOB_STATE_RUNNING, node="n1", device_ids=["n1/0"], submitted_at=100.0
    )

    class _Scheduler:
        def get(self, job_id: str) -> Any:
            if job_id != "j1":
                raise NotFound(f"no job {job_id!r}")
            return job

    class _Cache:
        def __init__(self, record: ServiceRecord) -> None:
            self.record = record

        def stats(self) -> Any:
            if self.record.instance_id == "cache-down":
                raise Unavailable("connection refused")
            return cache_pb2.CacheStats(
                hits=7,
                misses=7,
                job_stats=[
                    cache_pb2.JobStats(job_id="j1", dataset="ds", hits=6, misses=2, bytes_served=600),
                    cache_pb2.JobStats(job_id="j2", dataset="ds", hits=1, misses=5, bytes_served=100),
                ],
            )

    class _Compiler:
        def list_graphs(self) -> list[Any]:
            return [
                compiler_pb2.GraphState(
                    key="g1",
                    committed=True,
                    baseline_ms=4.0,
                    best_ms=2.0,
                    speedup=2.0,
                    best=compiler_pb2.Config(key="g1", values={"fuse": "on"}, committed=True),
                    trials=[compiler_pb2.Trial(trial=0, kind="baseline", step_ms=4.0, done=True)],
                    jobs=[compiler_pb2.GraphJob(job_id="j1", registered_at=120.0)],
                ),
                compiler_pb2.GraphState(key="g2", jobs=[compiler_pb2.GraphJob(job_id="j2")]),
            ]

    cfg = ConsoleConfig(profile="dev", view_token="viewer-token-123")
    app = create_app(cfg, MemoryKV(), start_recorder=False, use_redis=False)
    gw = app.state.console.gateway
    records = [
        ServiceRecord(name="cache", instance_id=i, address="127.0.0.1:1") for i in ("cache-a", "cache-down")
    ]
    gw.availability = lambda name: (True, "")
    gw.services = lambda name=None: records if name == "cache" else []
    gw.scheduler = lambda: _Scheduler()
    gw.cache = lambda record=None: _Cache(record)
    gw.compiler = lambda: _Compiler()
    with TestClient(app) as c:
        yield c


def test_links_endpoint_shows_timeline_hits_and_configuration_together(client: TestClient) -> None:
    r = client.get("/api/v1/jobs/j1/links", headers=VIEWER)  # a reader may see them
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["job"]["id"] == "j1" and body["job"]["timeline"][-1]["state"] == "running"
    assert body["cache"]["available"] is True
    assert [(d["dataset"], d["hits"], d["misses"], d["bytes_served"]) for d in body["cache"]["datasets"]] == [
        ("ds", 6, 2, 600)
    ]
    assert body["cache"]["errors"] == [{"instance_id": "cache-down", "error": "connection refused"}]
    [graph] = body["compiler"]["graphs"]
    assert graph["key"] == "g1" and graph["best"]["values"] == {"fuse": "on"} and graph["speedup"] == 2.0
    assert graph["job"]["registered_at"] == 120.0


def test_links_of_an_unknown_job_are_not_found_and_need_a_token(client: TestClient) -> None:
    r = client.get("/api/v1/jobs/nope/links", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"] == "NotFound"
    assert client.get("/api/v1/jobs/j1/links").status_code == 401
