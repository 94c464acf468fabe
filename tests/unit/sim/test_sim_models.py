"""Trace model names the performance model has not measured: refused unless mapped
explicitly (or run at default speeds by explicit choice); ``microco sim --json`` has cpu_s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microco.cli import sim as cli
from microco.services.scheduler.policy import make_policy
from microco.services.scheduler.sim import (
    ClusterSpec,
    PerfModel,
    TraceJob,
    UnknownModelError,
    read_model_map,
    simulate,
    write_trace_csv,
)

MEASURED = PerfModel(
    {"v100": {"A3C": 10.0, "CycleGAN": 4.0}}, {"v100": {("A3C", "A3C"): 0.5, ("CycleGAN", "CycleGAN"): 0.5}}
)
TRACE = [
    TraceJob("a", 0.0, 1, 100.0, model="A3C"),
    TraceJob("b", 1.0, 1, 100.0, model="resnet50"),
    TraceJob("c", 2.0, 1, 100.0, model="my-net"),
]


def test_unknown_models_refused_naming_them_and_the_measured_ones() -> None:
    with pytest.raises(UnknownModelError) as exc:
        simulate(make_policy("fifo"), TRACE, ClusterSpec.for_gpus(1, 1), perf=MEASURED)
    msg = str(exc.value)
    assert "'my-net'" in msg and "'resnet50'" in msg and "A3C" in msg and "CycleGAN" in msg
    assert exc.value.unknown == ["my-net", "resnet50"]


def test_mapping_runs_them_as_the_measured_model() -> None:
    cl = ClusterSpec.for_gpus(1, 1)
    mapped = simulate(
        make_policy("fifo"), TRACE, cl, perf=MEASURED, model_map={"resnet50": "CycleGAN", "my-net": "A3C"}
    )
    assert mapped.unknown_models == []
    # the same as a trace that named the measured models itself
    renamed = [
        TraceJob(j.job_id, j.submit_time, 1, 100.0, model=m)
        for j, m in zip(TRACE, ["A3C", "CycleGAN", "A3C"])
    ]
    same = simulate(make_policy("fifo"), renamed, cl, perf=MEASURED)
    assert mapped.per_job == same.per_job
    # a partial map still refuses what is left, and a map onto an unmeasured model is refused
    with pytest.raises(UnknownModelError, match="'my-net'"):
        simulate(make_policy("fifo"), TRACE, cl, perf=MEASURED, model_map={"resnet50": "CycleGAN"})
    with pytest.raises(ValueError, match="'ResNet-9' not measured"):
        simulate(make_policy("fifo"), TRACE, cl, perf=MEASURED, model_map={"resnet50": "ResNet-9"})


def test_default_speeds_only_by_explicit_choice() -> None:
    res = simulate(
        make_policy("fifo"), TRACE, ClusterSpec.for_gpus(1, 1), perf=MEASURED, on_unknown_model="default"
    )
    assert res.unknown_models == ["my-net", "resnet50"]
    with pytest.raises(ValueError, match="on_unknown_model"):
        simulate(make_policy("fifo"), TRACE, ClusterSpec.for_gpus(1, 1), on_unknown_model="guess")


def test_model_map_files(tmp_path: Path) -> None:
    j = tmp_path / "m.json"
    j.write_text(json.dumps({"resnet50": "CycleGAN"}))
    assert read_model_map(j) == {"resnet50": "CycleGAN"}
    t = tmp_path / "m.txt"
    t.write_text("# comment\nresnet50 = CycleGAN\n\nmy=net=A3C\n")
    assert read_model_map(t) == {"resnet50": "CycleGAN", "my=net": "A3C"}
    t.write_text("resnet50\n")
    with pytest.raises(ValueError, match=r"m.txt:1: expected NAME=KNOWN"):
        read_model_map(t)
    with pytest.raises(ValueError, match="cannot read model map"):
        read_model_map(tmp_path / "missing")


def _gavel_dir(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    gavel = {"v100": {"('A3C', 1)": {"null": 10.0, "('A3C', 1)": [5.0, 5.0]}}}
    (d / "gavel_throughputs.json").write_text(json.dumps(gavel))
    return d


def test_cli_refuses_unknown_models_with_a_clear_error(tmp_path: Path, capsys) -> None:
    d = _gavel_dir(tmp_path)
    p = tmp_path / "trace.csv"
    write_trace_csv(TRACE, p)
    base = ["sim", "--trace", str(p), "--traces-dir", str(d), "--policy", "fifo", "--gpus", "2", "--json"]
    assert cli.main(base) == 2
    err = capsys.readouterr().err
    assert "'my-net'" in err and "'resnet50'" in err and "--model-map" in err and "Traceback" not in err
    assert cli.main(base + ["--model-map", "resnet50=A3C", "--model-map", "my-net=A3C"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unknown_models"] == [] and out["jobs"] == 3
    assert isinstance(out["cpu_s"], float) and out["cpu_s"] >= 0
    m = tmp_path / "map.txt"
    m.write_text("resnet50=A3C\nmy-net=A3C\n")
    assert cli.main(base + ["--model-map-file", str(m)]) == 0
    capsys.readouterr()
    assert cli.main(base + ["--unknown-models", "default"]) == 0
    assert json.loads(capsys.readouterr().out)["unknown_models"] == ["my-net", "resnet50"]
    assert cli.main(base + ["--model-map", "resnet50=Nope"]) == 2
    assert "'Nope' not measured" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(base + ["--model-map", "no-equals-sign"])
