"""Schema-driven fuzzing of the console API with every system present (issue 16, "a fuzz suite
finds no 500"): the in-process app with stand-ins for the scheduler, store and compiler clients
that answer with real protobuf messages, so the views' mapping, pagination, windows and the
query stream run on fuzzed input too (``test_console_fuzz.py`` covers the app with no system)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis is not installed (pip install schemathesis)"
)

import os
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, settings
from schemathesis.checks import ignored_auth, response_schema_conformance

from microco.common.errors import NotFound
from microco.common.kv import MemoryKV
from microco.services.console import DEFAULT_DEV_TOKEN, ConsoleConfig, create_app
from microco.services.console._gateway import SYSTEMS

if not all(SYSTEMS[s].in_build() for s in ("scheduler", "store", "compiler")):
    pytest.skip("a system is not part of this build", allow_module_level=True)

from microco.api.compiler.v1 import compiler_pb2
from microco.api.scheduler.v1 import scheduler_pb2
from microco.api.store.v1 import store_pb2
from microco.clients.scheduler import spec_to_pb

_DEVICE = scheduler_pb2.ListNodesResponse.DESCRIPTOR.fields_by_name["devices"].message_type._concrete_class
JOBS = [
    scheduler_pb2.Job(
        id=f"j-{i}",
        state=[scheduler_pb2.JOB_STATE_RUNNING, scheduler_pb2.JOB_STATE_FINISHED][i % 2],
        node="n1",
        device_ids=[f"n1/{i % 2}"],
        submitted_at=1000.0 + i,
        finished_at=2000.0 + i if i % 2 else 0.0,
    )
    for i in range(5)
]


class _Scheduler:
    def list(self, states: list[str] = [], owner: str = "") -> list[Any]:  # noqa: B006
        return list(JOBS)

    def get(self, job_id: str) -> Any:
        for j in JOBS:
            if j.id == job_id:
                return j
        raise NotFound(f"no job {job_id!r}")

    def list_nodes(self) -> Any:
        return scheduler_pb2.ListNodesResponse(
            devices=[_DEVICE(id=f"n1/{k}", node="n1", index=k) for k in range(2)], leader="s1"
        )

    def submit(self, spec: Any) -> Any:
        return scheduler_pb2.Job(id="j-new", spec=spec, state=scheduler_pb2.JOB_STATE_QUEUED)

    def cancel(self, job_id: str) -> Any:
        return self.get(job_id)


def _ipc() -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([("x", pa.int64())])) as w:
        w.write_batch(pa.record_batch({"x": pa.array(range(50), pa.int64())}))
    return sink.getvalue().to_pybytes()


class _Store:
    def list_tables_pb(self) -> Any:
        return store_pb2.ListTablesResponse(tables=[store_pb2.Table(name=f"t{i}", rows=10) for i in range(3)])

    def nodes_pb(self) -> Any:
        return store_pb2.ListStoreNodesResponse(nodes=[store_pb2.StoreNode(name="sn-1", alive=True)])

    def recovery_pb(self) -> Any:
        return store_pb2.RecoveryStatus(json='{"state": "idle", "lost_extents": 0}')

    start_recovery_pb = recovery_pb

    def get_table_pb(self, name: str, placement: bool = False) -> Any:
        if name not in ("t0", "t1", "t2"):
            raise NotFound(f"no table {name!r}")
        return store_pb2.Table(name=name, rows=10)

    def explain_pb(self, query: Any) -> Any:
        return store_pb2.ExplainResponse(text="scan", plan_kind="matched", replicas_json="[]")

    def query_pb(self, query: Any, *, timeout: float | None = None) -> Any:
        data = _ipc()
        yield store_pb2.QueryResponse(arrow_ipc=data[:40], plan_kind="matched")
        yield store_pb2.QueryResponse(arrow_ipc=data[40:])


class _Compiler:
    def list_graphs(self) -> list[Any]:
        return [
            compiler_pb2.GraphState(
                key=f"g{i}",
                model_name="m",
                baseline_ms=2.0,
                best_ms=1.0,
                jobs=[compiler_pb2.GraphJob(job_id=f"j-{i}")],
            )
            for i in range(3)
        ]

    def get_graph(self, key: str) -> Any:
        if not key.startswith("g"):
            raise NotFound(f"no graph {key!r}")
        return compiler_pb2.GraphState(key=key)


app = create_app(ConsoleConfig(profile="dev"), MemoryKV(), start_recorder=False, use_redis=False)
_gw = app.state.console.gateway
_gw.availability = lambda name: (True, "")  # type: ignore[method-assign]
_gw.scheduler = lambda: _Scheduler()  # type: ignore[method-assign]
_gw.store = lambda: _Store()  # type: ignore[method-assign]
_gw.compiler = lambda: _Compiler()  # type: ignore[method-assign]
assert spec_to_pb  # the submit path maps through the shared spec mapping, as in production

# A generous read timeout (schemathesis's default is 10 s): the app runs in this process, and a
# machine busy with other work once took longer than 10 s to serve the schema at collection.
TIMEOUT_S = 120
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app, timeout=TIMEOUT_S)
FUZZ_EXAMPLES = int(os.environ.get("MICROCO_FUZZ_EXAMPLES", "0"))


def no_internal_error(ctx, response, case):
    assert response.status_code != 500, f"500 from {case.method} {case.path}: {response.text[:300]}"


# the endpoints that reach a system (the rest are fuzzed in test_console_fuzz.py); not the log,
# which reads an agent there is no stand-in for
SYSTEM_PATHS = (
    r"^/api/v1/(jobs|jobs/\{job_id\}|jobs/\{job_id\}/(cancel|links)|nodes|devices|cache|store.*|compiler.*)$"
)


@schema.include(path_regex=SYSTEM_PATHS).parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES or 3,
    derandomize=not FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_api_fuzz_with_every_system(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"},
        checks=[no_internal_error, response_schema_conformance, ignored_auth],
        timeout=TIMEOUT_S,
    )
