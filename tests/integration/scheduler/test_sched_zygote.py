"""The node agent's warm zygote: Python jobs forked from a pre-imported process behave like
processes started by exec (exit codes, signals, environment, CPU pinning, logs, stop, death
with the zygote). That a forked PyTorch (and Keras) job trains to bit-identical parameters is
shown under the full scheduler in ``test_sched_keras.py``."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys

import pytest
from _support import issued, wait_until

from microco.common.channel import dial
from microco.common.discovery import pid_alive
from microco.services.agent import ProcessManager, discover_devices


def need(module: str) -> None:
    """Skip without the framework, found without importing it (TensorFlow's import alone
    takes 15 s: the job processes pay it, the test process need not)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


pytestmark = pytest.mark.integration

SYN = [sys.executable, "-m", "microco.examples.synthetic_job"]


wait = functools.partial(wait_until, interval=0.02)


@pytest.fixture
def pm(tmp_path):
    m = ProcessManager(tmp_path / "agent", discover_devices("z", 2), preload=["numpy"])
    assert m.zygote is not None and m.zygote.ready.wait(60), "zygote did not warm up"
    yield m
    m.shutdown()


def test_forked_jobs_behave_like_exec_ones(pm, tmp_path):
    # A clean run: forked (not exec), exit 0, its environment, CPU set, cwd and output.
    out = tmp_path / "ok.json"
    workdir = tmp_path / "wd"
    workdir.mkdir()
    p = pm.start(
        "ok",
        [*SYN, "--steps", "30", "--compute-ms", "1", "--out", str(out)],
        {"FOO": "bar"},
        ["z/1"],
        workdir=str(workdir),
        attempt=1,
    )
    assert p.forked
    st = wait(lambda: p.status()["step"] >= 1 and p.status(), what="first step")
    cores = sorted(os.sched_getaffinity(0))
    if p.poll() is None:
        assert os.sched_getaffinity(p.pid) == {cores[1 % len(cores)]}
    wait(lambda: p.poll() is not None, what="exit")
    assert p.exit_code == 0 and json.loads(out.read_text())["steps"] == 30
    assert st["job_id"] == "ok"  # the hook read MICROCO_JOB_ID from the environment it was given

    # The job sees exactly the environment and cwd the agent gave it.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys\n"
        "json.dump({'cwd': os.getcwd(), 'foo': os.environ.get('FOO'), 'argv': sys.argv[1:],"
        " 'dev': os.environ.get('MICROCO_DEVICES'), 'omp': os.environ.get('OMP_NUM_THREADS'),"
        " 'sid': os.getsid(0) == os.getpid()}, open(sys.argv[1], 'w'))\n"
        "print('hello from the job')\n"
    )
    res = tmp_path / "probe.json"
    p = pm.start(
        "probe",
        [sys.executable, str(probe), str(res)],
        {"FOO": "bar"},
        ["z/0", "z/1"],
        workdir=str(workdir),
        attempt=1,
    )
    assert p.forked
    wait(lambda: p.poll() is not None, what="probe exit")
    got = json.loads(res.read_text())
    assert got == {
        "cwd": str(workdir),
        "foo": "bar",
        "argv": [str(res)],
        "dev": "z/0,z/1",
        "omp": "2",
        "sid": True,
    }
    assert "hello from the job" in p.log_path.read_text()

    # A failing job: its status and the tail of its log.
    p = pm.start("bad", [*SYN, "--steps", "9", "--fail-at", "2"], {}, ["z/0"], attempt=1)
    wait(lambda: p.poll() is not None, what="bad exit")
    assert p.forked and p.exit_code == 3 and "exited with 3" in p.message
    p = pm.start("boom", [sys.executable, "-m", "microco.examples.no_such_module"], {}, ["z/0"], attempt=1)
    wait(lambda: p.poll() is not None, what="boom exit")
    assert p.exit_code == 1 and "No module named" in p.message

    # Killed by a signal: -9, as Popen reports it. Stop: SIGTERM to its group.
    p = pm.start(
        "k", [*SYN, "--steps", "100000", "--compute-ms", "1", "--io-ms", "5"], {}, ["z/0"], attempt=1
    )
    wait(lambda: p.status()["step"] > 2, what="k running")
    os.kill(p.pid, signal.SIGKILL)
    wait(lambda: p.poll() is not None, what="k exit")
    assert p.exit_code == -9
    p = pm.start(
        "t", [*SYN, "--steps", "100000", "--compute-ms", "1", "--io-ms", "5"], {}, ["z/0"], attempt=1
    )
    wait(lambda: p.status()["step"] > 2, what="t running")
    pm.stop("t", grace_s=5)
    assert p.exit_code == -signal.SIGTERM

    # Not a Python module or script of this interpreter: started by exec as before.
    p = pm.start("sh", ["sh", "-c", "exit 4"], {}, ["z/0"], attempt=1)
    wait(lambda: p.poll() is not None, what="sh exit")
    assert not p.forked and p.exit_code == 4


def test_jobs_die_with_the_zygote_which_comes_back(pm):
    z = pm.zygote
    p = pm.start(
        "long", [*SYN, "--steps", "100000", "--compute-ms", "1", "--io-ms", "5"], {}, ["z/0"], attempt=1
    )
    assert p.forked
    wait(lambda: p.status()["step"] > 2, what="running")
    os.kill(z.pid, signal.SIGKILL)
    wait(lambda: p.poll() is not None, what="reported")
    assert p.exit_code == -9
    wait(
        lambda: not pid_alive(p.pid),
        10,
        "job gone with its zygote",
    )
    # A new zygote starts; meanwhile (cold) jobs are started by exec, later ones fork again.
    q = pm.start("next", [*SYN, "--steps", "3", "--compute-ms", "1"], {}, ["z/0"], attempt=1)
    wait(lambda: q.poll() is not None, what="next exit")
    assert q.exit_code == 0
    assert z.ready.wait(60) and z.starts == 2
    r = pm.start("again", [*SYN, "--steps", "3", "--compute-ms", "1"], {}, ["z/0"], attempt=1)
    wait(lambda: r.poll() is not None, what="again exit")
    assert r.forked and r.exit_code == 0


def test_forked_jobs_die_with_a_killed_agent(etcd_endpoint, etcd_kv, tmp_path):
    """kill -9 of the agent: its zygote dies with it, and the forked jobs with the zygote."""

    from microco.api.agent.v1 import agent_pb2, agent_pb2_grpc
    from microco.clients.agent import NODES_PREFIX
    from microco.services.scheduler._local import spawn_agent, stop_process

    agent = spawn_agent(
        etcd_endpoint, "zk", tmp_path / "zk", devices=1, kv=etcd_kv, preload="numpy", wait_warm=True
    )
    try:
        stub = agent_pb2_grpc.NodeAgentServiceStub(
            dial(etcd_kv.get_json(NODES_PREFIX + "zk")["address"], identity=issued("service:scheduler"))
        )
        assert list(stub.GetNode(agent_pb2.GetNodeRequest(), timeout=5).preloaded) == ["numpy"]
        cmd = [*SYN, "--steps", "100000", "--compute-ms", "1", "--io-ms", "5"]
        stub.StartProcess(
            agent_pb2.StartProcessRequest(job_id="j", command=cmd, device_ids=["zk/0"]), timeout=10
        )

        def proc():
            return next(p for p in stub.ListProcesses(agent_pb2.ListProcessesRequest(), timeout=5).processes)

        p = wait(lambda: (q := proc()).step > 2 and q, what="running")
        assert p.forked
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        wait(lambda: not pid_alive(p.pid), 10, "forked job outlived its agent")
    finally:
        stop_process(agent)
