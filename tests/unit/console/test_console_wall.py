"""The console on a wall screen (issue 17): one lane per device with finished jobs dropped after
a while, a utilisation heatmap, series cut to a window and marked at gaps, and a banner's worth of
services that left the registry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from microco.common.kv import MemoryKV
from microco.common.registry import ServiceRecord
from microco.services.console import DEFAULT_DEV_TOKEN, ConsoleConfig, create_app
from microco.services.console._gateway import SYSTEMS
from microco.services.console._wall import ServiceTracker, device_lanes, in_window, mark_gaps, utilisation

ADMIN = {"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"}
NOW = 10_000.0


def _job(
    jid: str, state: str, periods: list[tuple[str, float, float, list[str]]], finished_at: float = 0.0
) -> dict:
    return {
        "id": jid,
        "state": state,
        "finished_at": finished_at,
        "spec": {"name": f"name-{jid}"},
        "timeline": [
            {"state": s, "start": a, "end": b, "node": "n1", "devices": d, "migrated": False}
            for s, a, b, d in periods
        ],
    }


DEVICES = [{"id": "n1/gpu0", "node": "n1"}, {"id": "n1/gpu1", "node": "n1"}, {"id": "n1/gpu2", "node": "n1"}]
JOBS = [
    # ran on gpu0, finished 1000 s ago
    _job("old", "finished", [("queued", 8000, 8100, []), ("running", 8100, 9000, ["n1/gpu0"])], 9000),
    # running now on gpu1, packed with "b" for a while
    _job("a", "running", [("running", 9400, NOW, ["n1/gpu1"])]),
    _job("b", "running", [("packed", 9700, 9900, ["n1/gpu1"]), ("suspended", 9900, NOW, [])]),
]


def test_one_lane_per_device_and_finished_jobs_hidden_after_a_while() -> None:
    lanes = device_lanes(JOBS, DEVICES, now=NOW, window_s=3600, hide_finished_s=300)
    assert [lane["device"] for lane in lanes] == ["n1/gpu0", "n1/gpu1", "n1/gpu2"]  # idle ones too
    by = {lane["device"]: lane for lane in lanes}
    assert by["n1/gpu0"]["periods"] == []  # "old" ended 1000 s ago: hidden
    assert [(p["job_id"], p["state"]) for p in by["n1/gpu1"]["periods"]] == [
        ("a", "running"),
        ("b", "packed"),
    ]
    kept = device_lanes(JOBS, DEVICES, now=NOW, window_s=3600, hide_finished_s=None)
    assert [p["job_id"] for p in kept[0]["periods"]] == ["old"]


def test_lanes_are_cut_to_the_window() -> None:
    lanes = device_lanes(JOBS, DEVICES, now=NOW, window_s=300, hide_finished_s=None)
    gpu1 = lanes[1]["periods"]
    assert gpu1[0]["start"] == NOW - 300 and gpu1[0]["end"] == NOW
    assert lanes[0]["periods"] == []  # before the window


def test_utilisation_per_slice_counts_overlapping_jobs_once() -> None:
    lanes = device_lanes(JOBS, DEVICES, now=NOW, window_s=1000, hide_finished_s=None)
    use = {u["device"]: u["busy"] for u in utilisation(lanes, now=NOW, window_s=1000, buckets=4)}
    # slices of 250 s from 9000: [9000,9250) [9250,9500) [9500,9750) [9750,10000)
    assert use["n1/gpu0"] == [0.0, 0.0, 0.0, 0.0]  # "old" ended at 9000
    assert use["n1/gpu1"] == [0.0, 0.4, 1.0, 1.0]  # "a" from 9400; "b" packed inside it counts once
    assert use["n1/gpu2"] == [0.0, 0.0, 0.0, 0.0]


def test_series_are_cut_to_the_window_and_marked_at_gaps() -> None:
    points = [{"at": t, "v": 1} for t in (100, 102, 104, 130, 132, 90)]
    assert [p["at"] for p in in_window(points, 100)] == [100, 102, 104, 130, 132]
    marked = mark_gaps(in_window(points, 100), max_step_s=6)
    assert [p["at"] for p in marked if p.get("gap")] == [130]  # a new line starts after the gap
    assert [p["at"] for p in marked] == [100, 102, 104, 130, 132]


def test_a_service_that_leaves_the_registry_is_reported_gone_for_a_while() -> None:
    t = ServiceTracker(keep_s=600)
    a, b = ServiceRecord("store-node", "sn-1", "h:1"), ServiceRecord("store-node", "sn-2", "h:2")
    assert t.observe([a, b], now=0) == []
    [gone] = t.observe([a], now=10)
    assert (gone["name"], gone["instance_id"], gone["gone_at"], gone["last_seen"]) == (
        "store-node",
        "sn-2",
        10,
        0,
    )
    assert t.observe([a], now=20)[0]["gone_at"] == 10  # still gone, since 10
    assert t.observe([a, b], now=30) == []  # back
    assert t.observe([a], now=40) != [] and t.observe([a], now=700) == []  # forgotten after keep_s


@pytest.fixture
def app() -> Any:
    return create_app(ConsoleConfig(profile="dev"), MemoryKV(), start_recorder=False, use_redis=False)


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def test_the_services_api_names_what_disappeared(app: Any, client: TestClient) -> None:
    kv = app.state.console.gateway.kv
    recs = [ServiceRecord("store-node", f"sn-{i}", f"127.0.0.1:{i + 1}") for i in range(3)]
    for r in recs:
        kv.put(r.key, r.to_json())
    assert client.get("/api/v1/services", headers=ADMIN).json()["gone"] == []
    kv.delete(recs[1].key)  # the node was killed: its lease expired
    body = client.get("/api/v1/services", headers=ADMIN).json()
    assert len(body["services"]) == 2
    assert [(g["name"], g["instance_id"]) for g in body["gone"]] == [("store-node", "sn-1")]


class _Scheduler:
    def list_nodes(self) -> Any:
        from microco.api.scheduler.v1 import scheduler_pb2

        fields = scheduler_pb2.ListNodesResponse.DESCRIPTOR.fields_by_name
        dev_type = fields["devices"].message_type._concrete_class
        return scheduler_pb2.ListNodesResponse(
            devices=[dev_type(id=d["id"], node=d["node"]) for d in DEVICES]
        )

    def list(self, states: list[str] = [], owner: str = "") -> list[Any]:  # noqa: B006
        from microco.api.scheduler.v1 import scheduler_pb2

        return [
            scheduler_pb2.Job(
                id="j1",
                state=scheduler_pb2.JOB_STATE_RUNNING,
                node="n1",
                device_ids=["n1/gpu1"],
                submitted_at=1.0,
            )
        ]


@pytest.mark.skipif(not SYSTEMS["scheduler"].in_build(), reason="the scheduler is not part of this build")
def test_the_devices_api_gives_lanes_and_utilisation(app: Any, client: TestClient, monkeypatch) -> None:
    gw = app.state.console.gateway
    monkeypatch.setattr(gw, "scheduler", lambda: _Scheduler())
    monkeypatch.setattr(gw, "availability", lambda name: (True, ""))
    # what the recorder saw 100 s ago: j1 running on n1/gpu1
    import time

    from microco.services.console import _views as views
    from microco.services.console._proto import to_dict

    [job] = _Scheduler().list()
    views.record_job(app.state.console.series, to_dict(job), time.time() - 100, {})
    body = client.get("/api/v1/devices", headers=ADMIN, params={"window_s": 600, "buckets": 10}).json()
    assert [lane["device"] for lane in body["lanes"]] == ["n1/gpu0", "n1/gpu1", "n1/gpu2"]
    gpu1 = body["lanes"][1]["periods"]
    assert gpu1 and gpu1[-1]["job_id"] == "j1" and gpu1[-1]["state"] == "running"
    assert body["bucket_s"] == 60 and all(len(u["busy"]) == 10 for u in body["utilisation"])
    assert body["utilisation"][1]["busy"][-1] > 0 and body["utilisation"][0]["busy"] == [0.0] * 10
    page = client.get("/api/v1/devices", headers=ADMIN, params={"limit": 2}).json()
    assert len(page["lanes"]) == 2 and page["next_cursor"]
    assert client.get("/api/v1/devices", headers=ADMIN, params={"window_s": 5}).status_code == 422
