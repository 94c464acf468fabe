"""Issue 21 on the live platform: real etcd, a real scheduler, two node agents and a cache
server on each of their nodes (separate processes on free ports), and a real training job
(PyTorch, the scheduler hook, the cache loader) submitted as a user submits one.

The operator migrates the job to the other node mid-epoch. What must be true for a user:

* the new node's cache server is warmed with the job's dataset by the scheduler's phases alone
  (the job, restarted there, reads nothing until the warm shows: a deadline, not a sleep);
* the job continues its epoch where its sampler left it: every sample of every epoch trained
  on exactly once across the move;
* the cache it left drops the job at once, and so does the new one when it finishes (both
  servers' job TTL is ten minutes, so only the scheduler's phases can drop it);
* in the job, the hook's stream is the one measurement: one record per mini-batch, the cache
  loader's benefit-estimate input (its compute time) is the records' own figure, and the
  mini-batch time the scheduler shows for the job is one the hook computed from them.

Then two jobs time-sliced on one device (the cache keeps the suspended one and brings in its
unread chunks before its slice), three (the one waiting behind another lends its allocation
share until it is next), and one training loop against a live cache server and a live
compiler service (the compiler's stored step times are the stream's figures).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from _codesign import spy_wrapper, train
from _support import wait_for_jobs

from microco.clients.cache import CacheClient, register_dataset
from microco.clients.scheduler import SchedulerClient, make_spec
from microco.common import channel_for
from microco.common.registry import discover
from microco.services.runtime.launch import start_service, stop_process
from microco.services.scheduler._local import spawn_agent, spawn_scheduler
from microco.services.stack import free_port

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

JOBS = "/microco/scheduler/jobs/"
PHASES = "/microco/scheduler/phases/"
JOB_DATASETS = "/microco/cache/jobs/"
SAMPLES, EPOCHS, BATCH = 48, 3, 2
POLICY = {"quantum_s": 1000, "enable_packing": False, "enable_grow_shrink": False, "enable_migration": False}

# The user's job: a model, the hook (with the loader as its sampler, so the checkpoint holds the
# loader's place in its epoch), the loader from the dataset registered in etcd through this
# node's cache server. Each step's samples are written down before ``step_end`` (which may
# checkpoint and exit for the migration). After a restore, before it reads anything, it writes
# down once (no waiting) what its new node's cache server reported of the warm in etcd and what
# that server holds: the scheduler started it only after that report.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from microco.clients import telemetry
    from microco.clients.cache import CacheClient, find_server, open_loader
    from microco.clients.scheduler import TorchHook
    from microco.common.discovery import connect_etcd

    out, dataset, epochs, step_sleep, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    prefetch = sys.argv[6] == "1"  # the loader's own background prefetch
    node = os.environ["MICROCO_NODE"]
    kv = connect_etcd()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = open_loader(kv, dataset, batch_size=batch, job_id=os.environ["MICROCO_JOB_ID"], prefetch=prefetch)
    hook = TorchHook(model, opt, sampler=loader)
    stream = telemetry.current()
    records = []
    stream.subscribe(records.append)
    start = hook.restore()
    log = open(out, "a")
    warm = report = None
    if start:
        report = kv.get_json("/microco/cache/warm/" + os.environ["MICROCO_JOB_ID"])
        with CacheClient(find_server(kv)) as cache:
            warm = {d.dataset: d.chunks for d in cache.stats().datasets}
    line = {"host": node, "restored_from": start, "warm": warm, "report": report, "server": find_server(kv)}
    log.write(json.dumps(line) + "\\n")
    log.flush()
    first = loader.resume_epoch or 0
    for epoch in range(first, epochs):
        for indices, _data in loader.epoch(epoch):
            x = torch.ones(len(indices), 8) * torch.tensor(indices, dtype=torch.float32)[:, None]
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(step_sleep)
            log.write(json.dumps({"host": node, "step": hook.step + 1, "epoch": epoch, "indices": indices}) + "\\n")
            log.flush()
            hook.step_end()
            log.write(json.dumps({"mb": hook.context.minibatch_ms()}) + "\\n")  # what it reports
            log.flush()
    compute = sum(r.compute_s for r in records)
    summary = {
        "host": node, "done": True, "records": len(records), "published": stream.published,
        "loader_compute_s": loader.stats.compute_s, "records_compute_s": compute,
        "hook_last_ms": hook.context._last_ms, "last_record_ms": records[-1].step_s * 1000.0,
    }
    log.write(json.dumps(summary) + "\\n")
    log.flush()
    loader.close()
    hook.finish()
    """
)


# A job tuned by the compiler service (AstraTorch, through the scheduler's hook): on its first
# node it trains until the service commits a configuration for its graph, then on (slowly) until
# it is moved; restored on another node, it writes down after a few steps whether it runs the
# committed configuration and how many exploration steps it took there.
TUNED_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from microco.clients.compiler import RemoteExplorer
    from microco.clients.compiler._torch import AstraTorch
    from microco.clients.compiler.zoo import torch_models as zm
    from microco.clients.scheduler import TorchHook
    from microco.common.discovery import connect_etcd

    out = sys.argv[1]
    node = os.environ["MICROCO_NODE"]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = zm.make_model("lstm", 6, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = TorchHook(model, opt)
    astra = AstraTorch(
        model, RemoteExplorer.from_etcd(connect_etcd(), default_timeout=30.0), name="codesign-tuned",
        total_steps=400, threads=("1",), compile_choices=("eager",), background=False,
    )
    x, y = zm.synthetic_batch(4, 8, 6, seed=0)
    start = hook.restore()
    log = open(out, "a")
    log.write(json.dumps({"host": node, "restored_from": start}) + "\\n")
    log.flush()
    said = False
    for step in range(start, start + 3000):
        with astra.step():
            loss = zm.loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if astra.committed and not said and (start == 0 or step >= start + 3):
            said = True
            line = {"host": node, "committed": True, "explore_steps": astra.explore_steps, "config": astra.config}
            log.write(json.dumps(line) + "\\n")
            log.flush()
            if start:
                break  # (moved: done)
        if astra.committed:
            time.sleep(0.05)  # (a boundary a step for the move)
        hook.step_end()
    hook.finish()
    """
)


def _cache(tmp_path: Path, etcd: str, node: str, ttl_s: float, follow: bool = True):
    port = free_port()
    proc = start_service(
        "microco.services.cache",
        [
            "--port", str(port), "--etcd", etcd, "--node", node, "--capacity", "16M",
            "--job-ttl-s", str(ttl_s), "--data-dir", str(tmp_path / f"cache-{node}"),
            "--instance-id", f"cache-{node}", "--metrics-port", "-1", "--log-format", "text",
            *([] if follow else ["--no-follow-scheduler"]),
        ],
        log_path=tmp_path / f"cache-{node}.log",
    )  # fmt: skip
    return proc


def _dataset(kv, tmp_path: Path, name: str, samples: int, chunk_bytes: int):
    data = tmp_path / name
    data.mkdir()
    for i in range(samples):
        (data / f"s{i:03d}").write_bytes((f"{name}/{i:04d};".encode() * 150)[:1500])  # its own bytes
    return register_dataset(kv, name, str(data), chunk_bytes=chunk_bytes)


@contextmanager
def _platform(
    kv,
    etcd: str,
    tmp_path: Path,
    nodes: tuple[str, ...],
    policy: dict,
    ttl_s: float,
    *,
    cache_nodes: tuple[str, ...] | None = None,
    scheduler_args: tuple[str, ...] = (),
    devices: int = 1,
    follow: bool = True,
    preload: str = "none",
):
    """A cache server (on ``cache_nodes``, default every node; ``follow``: following the
    scheduler's phases) and an agent of ``devices``
    virtual devices on each node, and a scheduler: separate processes. Yields (scheduler
    client, {node: cache server address}). ``preload="auto"``: the agents' warm zygote (torch
    imported once a node, its jobs forked from it), for a test that starts several torch jobs
    on one node."""
    cache_nodes = nodes if cache_nodes is None else cache_nodes
    procs = []
    try:
        for node in cache_nodes:
            procs.append(_cache(tmp_path, etcd, node, ttl_s, follow))
        for node in nodes:
            procs.append(
                spawn_agent(
                    etcd,
                    node,
                    tmp_path / "agents" / node,
                    devices=devices,
                    checkpoint_root=tmp_path / "checkpoints",
                    kv=kv,
                    log_path=tmp_path / f"agent-{node}.log",
                    lease_ttl_s=10,
                    preload=preload,
                    wait_warm=preload != "none",
                )  # fmt: skip
            )
        procs.append(
            spawn_scheduler(
                etcd,
                tmp_path / "sched",
                policy_config=policy,
                kv=kv,
                log_path=tmp_path / "sched.log",
                extra_args=list(scheduler_args),
            )
        )
        wait_for_jobs(
            lambda: len({r.labels.get("node") for r in discover(kv, "cache")}) == len(cache_nodes),
            kv,
            120,
            "caches",
        )
        caches = {r.labels["node"]: r.address for r in discover(kv, "cache")}
        client = SchedulerClient(channel_for(kv, "scheduler"))
        try:
            yield client, caches
        finally:
            client.close()
    finally:
        for p in procs:
            stop_process(p)


def _submit(
    client, tmp_path: Path, name: str, dataset: str, epochs: int, batch: int, prefetch: bool = True
) -> tuple[str, Path]:
    out = tmp_path / f"{name}.jsonl"
    script = tmp_path / "job.py"
    script.write_text(JOB)
    cmd = [
        sys.executable,
        str(script),
        str(out),
        dataset,
        str(epochs),
        "0.15",
        str(batch),
        "1" if prefetch else "0",
    ]
    return client.submit(make_spec(cmd, devices=1, name=name)).id, out


def _first(history: list[str], words: str) -> int:
    """The index of the first history message with ``words`` (fails when none has)."""
    found = [i for i, message in enumerate(history) if words in message]
    assert found, (words, history)
    return found[0]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def test_a_migrated_job_finds_its_data_warm_and_continues_its_epoch(etcd_endpoint, etcd_kv, tmp_path):
    kv = etcd_kv
    rec, index = _dataset(kv, tmp_path, "codesign-live", SAMPLES, 6000)
    assert len(index.chunks) > 4
    # The restart waits for the warm's report (the deadline only for a cache that never reports).
    platform = _platform(
        kv,
        etcd_endpoint,
        tmp_path,
        ("na", "nb"),
        POLICY,
        ttl_s=600,
        scheduler_args=("--cache-warm-wait-s", "90"),
    )
    with platform as (client, addresses):
        caches = {node: CacheClient(address) for node, address in addresses.items()}

        def wait(cond, what, timeout=120.0):
            return wait_for_jobs(cond, kv, timeout, what)

        job, out = _submit(client, tmp_path, "codesign-live", rec.qualified, EPOCHS, BATCH)

        def record():
            return kv.get_json(JOBS + job) or {}

        r = wait(
            lambda: (r := record()).get("state") == "running" and r.get("step", 0) >= 6 and r, "job at step 6"
        )
        old = r["devices"][0].split("/", 1)[0]  # device ids are <node>/<index>
        new = "nb" if old == "na" else "na"
        # the job read through its node's cache server (which published its dataset in etcd)
        wait(lambda: job in caches[old].stats().jobs, "the job known to its node's cache")
        client.control(job, "migrate", devices=[f"{new}/0"])
        # the cache it leaves forgets it at once (its TTL is ten minutes)
        wait(lambda: job not in caches[old].stats().jobs, "the old cache drops the moved job")
        wait(lambda: record().get("state") in ("finished", "failed", "cancelled"), "the job ended", 240)
        assert record()["state"] == "finished", (record().get("message"), out.read_text())
        # and the new one forgets it at once when it ends
        wait(lambda: job not in caches[new].stats().jobs, "the new cache drops the finished job")
        # (published by the tick that recorded the end: the test may read the record between)
        wait(lambda: (kv.get_json(PHASES + job) or {}).get("phase") == "finished", "its phase finished")

        lines = _lines(out)
        starts = [x for x in lines if "restored_from" in x]
        assert [s["host"] for s in starts] == [old, new], starts
        moved = starts[1]
        assert moved["restored_from"] >= 6 and moved["server"] == addresses[new]
        # warmed before the job read a byte there: the follower's doing, reported before the
        # job's first read there (the job read the report first), and the scheduler started
        # the job there only after that report (the order of its history)
        report = moved["report"]
        assert report and report["node"] == new and report["ok"] and report["chunks"] > 0, moved
        assert moved["warm"][rec.qualified] >= report["chunks"], moved
        history = [message for _at, _state, message in record()["history"]]
        # (it waited, unless the report was in before its checkpoint: the warm started first)
        waited = [i for i, m in enumerate(history) if f"waiting for the cache on {new} to warm" in m]
        warmed = _first(history, f"cache on {new} warm")
        assert all(i < warmed for i in waited) and warmed < _first(history, f"on {new}/0 (attempt 2)")
        assert not any("without a warm cache" in m for m in history), history
        # its epoch continued where the sampler left it: every sample once an epoch
        steps: dict[int, dict] = {}
        for x in lines:
            if "step" in x:
                steps[x["step"]] = x  # a step redone after the checkpoint counts once (its last)
        assert sorted(steps) == list(range(1, EPOCHS * SAMPLES // BATCH + 1))
        for epoch in range(EPOCHS):
            seen = sorted(i for x in steps.values() if x["epoch"] == epoch for i in x["indices"])
            assert seen == list(range(SAMPLES)), (epoch, seen)
        assert {x["host"] for x in steps.values() if x["step"] > moved["restored_from"]} == {new}
        # one measurement per step in the job: the loader's benefit input is the stream's figure
        [summary] = [x for x in lines if x.get("done")]
        assert summary["host"] == new
        assert (
            summary["records"] == summary["published"] == EPOCHS * SAMPLES // BATCH - moved["restored_from"]
        )
        assert summary["loader_compute_s"] == pytest.approx(summary["records_compute_s"], rel=1e-9)
        assert summary["hook_last_ms"] == summary["last_record_ms"]
        # the scheduler's introspection shows a figure the hook computed from those records
        assert record()["minibatch_ms"] in {x["mb"] for x in lines if "mb" in x}, record()["minibatch_ms"]
        for c in caches.values():
            c.close()


def test_a_time_sliced_job_keeps_its_share_and_is_prefetched_before_its_slice(
    etcd_endpoint, etcd_kv, tmp_path
):
    """Two jobs on one device, time-sliced by the live scheduler (Gandiva, 8 s quantum), each
    reading its own dataset through the node's cache server (job TTL 1.5 s). While the first is
    suspended (parked) and next to run, the cache keeps it past the TTL and brings in the chunks
    of its dataset it has not read this epoch (its loader's own prefetch is off, so only the
    scheduler's phases can bring them); both are dropped when they finish."""
    kv = etcd_kv
    ra, ia = _dataset(kv, tmp_path, "slice-a", 240, 15000)  # 24 chunks of 10 samples
    rb, _ = _dataset(kv, tmp_path, "slice-b", 240, 15000)
    policy = {**POLICY, "quantum_s": 8}
    with _platform(kv, etcd_endpoint, tmp_path, ("ns",), policy, ttl_s=1.5, preload="auto") as (
        client,
        caches,
    ):
        cache = CacheClient(caches["ns"])

        def wait(cond, what, timeout=120.0):
            return wait_for_jobs(cond, kv, timeout, what)

        def state(job):
            return (kv.get_json(JOBS + job) or {}).get("state")

        def held(dataset):
            return {d.dataset: d.chunks for d in cache.stats().datasets}.get(dataset, 0)

        a, out_a = _submit(client, tmp_path, "slice-a", ra.qualified, 1, BATCH, prefetch=False)
        wait(lambda: (kv.get_json(JOBS + a) or {}).get("step", 0) >= 2, "a trains")
        b, out_b = _submit(client, tmp_path, "slice-b", rb.qualified, 1, BATCH, prefetch=False)

        def while_a_waits(cond):
            def check():
                return state(a) == "suspended" and cond() and state(a) == "suspended"

            return check

        wait(
            lambda: (kv.get_json(PHASES + a) or {}).get("phase") == "resuming" and state(b) == "running",
            "a suspended, next to run, b running",
        )
        # the chunks it has not read this epoch are brought in for it while it waits
        wait(while_a_waits(lambda: held(ra.qualified) == len(ia.chunks)), "a's unread chunks prefetched")
        # and it stays known past the TTL, silent (parked) longer than it
        since = time.monotonic()

        def kept():  # known, and its dataset's allocation counts it (restored: it is next)
            shares = cache.allocations().allocations
            return a in cache.stats().jobs and any(
                a in al.jobs for al in shares if al.dataset == ra.qualified
            )

        wait(
            while_a_waits(lambda: time.monotonic() - since > 3.0 and kept()),
            "a and its share kept past the TTL",
        )
        for job in (a, b):
            wait(lambda job=job: state(job) in ("finished", "failed", "cancelled"), f"{job} ended", 240)
            assert state(job) == "finished", kv.get_json(JOBS + job)
        wait(lambda: not {a, b} & set(cache.stats().jobs), "both dropped when they finished")
        for out in (out_a, out_b):  # each job's one epoch: every sample once, across its slices
            seen = sorted(i for x in _lines(out) if "step" in x for i in x["indices"])
            assert seen == list(range(240))
        cache.close()


def test_one_loop_measures_each_step_once_for_the_live_cache_and_compiler(etcd_endpoint, etcd_kv, tmp_path):
    """The three client libraries in one training loop against a cache server and a compiler
    service (separate processes): one stream record per step, and the step times the compiler
    service holds for the job's graph, read back over gRPC, are the wrapper's figures taken
    from those records (its compute time plus the rollback copies it adds), no clock of its
    own; the cache server counted the loader's reports."""
    import torch

    from microco.clients import telemetry
    from microco.clients.cache import QuiverLoader
    from microco.clients.compiler import RemoteExplorer
    from microco.clients.compiler._torch import AstraTorch
    from microco.clients.compiler.zoo import torch_models as zm
    from microco.clients.scheduler import TorchHook
    from microco.services.cache import LocalStore

    kv = etcd_kv
    port = free_port()
    compiler = start_service(
        "microco.services.compiler",
        [
            "--port",
            str(port),
            "--etcd",
            etcd_endpoint,
            "--metrics-port",
            "-1",
            "--data-dir",
            str(tmp_path / "c"),
        ],
        log_path=tmp_path / "compiler.log",
    )
    cache = _cache(tmp_path, etcd_endpoint, "nt", 600)
    procs = [compiler, cache]
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        wait_for_jobs(
            lambda: discover(kv, "cache") and discover(kv, "compiler"), kv, 120, "cache and compiler"
        )
        _rec, index = _dataset(kv, tmp_path, "loop", 24, 6000)  # 6 batches an epoch
        store = LocalStore(str(tmp_path / "loop"))
        torch.manual_seed(0)
        model = zm.make_model("lstm", 6, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        hook = TorchHook(model, opt, job_id="loop-job")
        stream = hook.context.telemetry
        records: list[telemetry.StepRecord] = []
        stream.subscribe(records.append)
        address = discover(kv, "cache")[0].address
        loader = QuiverLoader(index, store, batch_size=4, dataset="loop", job_id="loop-job", server=address)
        explorer = RemoteExplorer.from_address(discover(kv, "compiler")[0].address, default_timeout=10.0)
        astra = AstraTorch(
            model, explorer, name="loop-lstm", total_steps=400, threads=("1",), compile_choices=("eager",),
            background=False,
        )  # fmt: skip
        recorded, guards = spy_wrapper(astra)  # (guards: what it adds for its rollback copies)
        steps = train(loader, astra, hook, model, opt, zm.synthetic_batch(4, 8, 6, seed=0), 4)
        hook.finish()
        wrapper_ms = [args[0] for args in recorded]
        assert steps == len(records) == stream.published == 24
        assert loader.stats.compute_s == pytest.approx(sum(r.compute_s for r in records), rel=1e-9)
        key = astra.spec().key
        astra.restore()
        loader.close()
        # every step time the compiler service holds is one the wrapper took from a record
        held = [ms for t in explorer.get_graph(key).trials for ms in t.steps]
        assert held and set(held) <= set(wrapper_ms), (held, wrapper_ms)
        # (the first step is the wrapper's probe; then a step recorded per record until it commits;
        # once committed, the wrapper may stop reading records: fewer guards than records)
        pairs = list(zip(records[1:], guards[1:]))[: len(wrapper_ms)]
        assert len(pairs) == len(wrapper_ms)
        for ms, (rec, guard) in zip(wrapper_ms, pairs, strict=True):
            assert ms == pytest.approx(rec.compute_s * 1e3 + guard, abs=1e-6)
        # and the cache server counted this job's reports (the batches it was told of by then)
        [job] = [j for j in CacheClient(address).stats().job_stats if j.job_id == "loop-job"]
        assert job.dataset == "loop" and 0 < job.hits + job.misses <= loader.stats.hits + loader.stats.misses
        explorer.close()
    finally:
        torch.set_num_threads(old_threads)
        for p in procs:
            stop_process(p)


def test_a_suspended_job_lends_its_share_until_it_is_next(etcd_endpoint, etcd_kv, tmp_path):
    """Three jobs on one device, time-sliced by the live scheduler, each with its own dataset.
    While the first waits with another job ahead of it, it is kept past the cache's TTL but its
    allocation share is lent (its dataset's allocation does not count it); once it is the next
    to run, the share is restored and its unread chunks are brought in. Cancelled jobs are
    dropped at once."""
    kv = etcd_kv
    names = ("lend-a", "lend-b", "lend-c")
    regs = {n: _dataset(kv, tmp_path, n, 240, 15000) for n in names}
    policy = {**POLICY, "quantum_s": 8}
    with _platform(kv, etcd_endpoint, tmp_path, ("nl",), policy, ttl_s=1.5, preload="auto") as (
        client,
        caches,
    ):
        cache = CacheClient(caches["nl"])

        def wait(cond, what, timeout=120.0):
            return wait_for_jobs(cond, kv, timeout, what)

        def state(job):
            return (kv.get_json(JOBS + job) or {}).get("state")

        def phase(job):
            return (kv.get_json(PHASES + job) or {}).get("phase")

        def counted(job, dataset):
            return any(job in al.jobs for al in cache.allocations().allocations if al.dataset == dataset)

        jobs = {}
        for n in names:
            jobs[n], _ = _submit(client, tmp_path, n, regs[n][0].qualified, 1, BATCH, prefetch=False)
            if n == "lend-a":
                wait(lambda: (kv.get_json(JOBS + jobs["lend-a"]) or {}).get("step", 0) >= 2, "a trains")
        a, b, c = (jobs[n] for n in names)
        ds_a, index_a = regs["lend-a"][0].qualified, regs["lend-a"][1]
        # b runs, c (never run: the least served) is next, a waits behind it: lent
        wait(
            lambda: state(b) == "running" and phase(c) == "resuming" and phase(a) == "suspended", "b's slice"
        )
        since = time.monotonic()

        def lent():
            ok = time.monotonic() - since > 3.0 and a in cache.stats().jobs and not counted(a, ds_a)
            return ok and phase(a) == "suspended"

        wait(lent, "a kept past the TTL with its share lent")
        # later another job runs and a is next: its share is back, its unread chunks come in
        wait(lambda: state(a) == "suspended" and phase(a) == "resuming", "a next to run")

        def restored():
            held = {d.dataset: d.chunks for d in cache.stats().datasets}.get(ds_a, 0)
            return counted(a, ds_a) and held == len(index_a.chunks) and state(a) == "suspended"

        wait(restored, "a's share restored and its unread chunks brought in")
        for job in (a, b, c):
            client.cancel(job)
        wait(lambda: not {a, b, c} & set(cache.stats().jobs), "the cancelled jobs dropped at once")
        cache.close()


def test_a_tuned_job_moved_to_a_node_whose_cache_never_reports_restarts_after_the_deadline_tuned(
    etcd_endpoint, etcd_kv, tmp_path
):
    """A job whose graph the live compiler service tuned (AstraTorch committed a configuration)
    is migrated by the operator to the other node, whose cache server does not follow the
    scheduler (``--no-follow-scheduler``: it never warms nor reports): the scheduler waits for
    that node's cache to report the warm, none comes, and it restarts the job there after its
    deadline (the history says so). Restored there, the job runs the committed
    configuration from its first step: zero exploration steps (the configuration followed it,
    through the compiler service's commit for the graph and this hardware)."""
    kv = etcd_kv
    compiler = start_service(
        "microco.services.compiler",
        ["--port", str(free_port()), "--etcd", etcd_endpoint, "--metrics-port", "-1", "--data-dir",
         str(tmp_path / "compiler"), "--measure-steps", "1"],
        log_path=tmp_path / "compiler.log",
    )  # fmt: skip
    platform = _platform(
        kv, etcd_endpoint, tmp_path, ("na", "nb"), POLICY, 600, follow=False,
        scheduler_args=("--cache-warm-wait-s", "2"),
    )  # fmt: skip
    try:
        with platform as (client, _caches):
            wait_for_jobs(lambda: discover(kv, "compiler"), kv, 120, "compiler")
            out = tmp_path / "tuned.jsonl"
            script = tmp_path / "tuned.py"
            script.write_text(TUNED_JOB)
            job = client.submit(
                make_spec([sys.executable, str(script), str(out)], devices=1, name="tuned")
            ).id

            def record():
                return kv.get_json(JOBS + job) or {}

            wait_for_jobs(lambda: any(x.get("committed") for x in _lines(out)), kv, 120, "a committed config")
            [tuned] = [x for x in _lines(out) if x.get("committed")]
            assert tuned["explore_steps"] > 0  # (tuned on its first node: it explored)
            old = tuned["host"]
            new = "nb" if old == "na" else "na"
            client.control(job, "migrate", devices=[f"{new}/0"])
            wait_for_jobs(
                lambda: record().get("state") in ("finished", "failed", "cancelled"), kv, 240, "end"
            )
            assert record()["state"] == "finished", (record().get("message"), out.read_text())
            history = [message for _at, _state, message in record()["history"]]
            waited = _first(history, f"waiting for the cache on {new} to warm")
            went_on = _first(history, f"went on without a warm cache on {new}")
            assert waited < went_on < _first(history, f"on {new}/0 (attempt 2)")
            lines = _lines(out)
            assert [x["host"] for x in lines if "restored_from" in x] == [old, new]
            [moved] = [x for x in lines if x.get("committed") and x["host"] == new]
            assert moved["explore_steps"] == 0 and moved["config"] == tuned["config"], (tuned, moved)
    finally:
        stop_process(compiler)


def test_dataset_affinity_gives_a_free_device_to_the_job_of_a_running_dataset(
    etcd_endpoint, etcd_kv, tmp_path
):
    """Gandiva's ``dataset_affinity`` on the live scheduler, its datasets from the cache server
    (which learns each job's from its loader and publishes it in etcd). On a node of two
    devices, a1 (dataset A) runs; b1 (dataset B) and a2 (A) have each run (so the cache knows
    their datasets) and wait, b1 with less attained service than a2. When a device frees,
    Gandiva's order (least attained service) would give it to b1; with the setting, a2 goes
    first, its dataset being read by a1, which keeps its device. (The scene is set with
    operator suspends and resumes, no slicing: the quantum is long.)"""
    kv = etcd_kv
    regs = {n: _dataset(kv, tmp_path, n, 48, 6000)[0] for n in ("aff-a", "aff-b")}
    policy = {**POLICY, "dataset_affinity": True}
    with _platform(kv, etcd_endpoint, tmp_path, ("nd",), policy, 600, devices=2, preload="auto") as (
        client,
        _caches,
    ):

        def job(name, ds):
            return _submit(client, tmp_path, name, regs[ds].qualified, 40, BATCH, prefetch=False)[0]

        def rec(j):
            return kv.get_json(JOBS + j) or {}

        def running(j, steps=1):
            def check():
                r = rec(j)
                return r.get("state") == "running" and r.get("step", 0) >= steps

            return check

        def known(j):  # the cache server published the job's dataset
            return bool(kv.get_json(JOB_DATASETS + j))

        def wait(cond, what):
            return wait_for_jobs(cond, kv, 120, what)

        def suspend(j):
            client.control(j, "suspend")
            wait(lambda: rec(j).get("state") == "suspended", f"{j} suspended")

        a1, b1 = job("a1", "aff-a"), job("b1", "aff-b")
        wait(lambda: running(a1)() and running(b1)() and known(a1) and known(b1), "a1 and b1 read")
        suspend(b1)  # (held by the operator)
        a2 = job("a2", "aff-a")
        wait(lambda: running(a2)() and known(a2), "a2 reads")
        wait(lambda: rec(a2)["attained_service_s"] > rec(b1)["attained_service_s"] + 1.0, "a2 served more")
        suspend(a2)
        filler = job("f", "aff-b")  # holds the free device while both are let go
        wait(running(filler), "the filler runs")
        for j in (b1, a2):
            client.control(j, "resume")  # (the policy places them: no device is free)
        wait(lambda: all(not rec(j).get("operator") for j in (b1, a2)), "both back to the policy")
        assert rec(b1)["state"] == rec(a2)["state"] == "suspended"
        assert rec(b1)["attained_service_s"] < rec(a2)["attained_service_s"]
        client.cancel(filler)
        wait(lambda: "running" in (rec(b1)["state"], rec(a2)["state"]), "a freed device taken")
        assert rec(a2)["state"] == "running" and rec(b1)["state"] == "suspended", (rec(a2), rec(b1))
        for j in (a1, b1, a2):
            client.cancel(j)
