"""Which dataset each job reads, as the cache servers know it: one small etcd key per job.

    /microco/cache/jobs/<job id>  ->  {"dataset", "node"}

The cache server a job reports to writes it (``services/cache/_follow.py``) once the job's
loader has named its dataset, and deletes it when the job is gone. Readers: the cache on the
host a job migrates to (it warms that dataset before the job restarts) and the scheduler
(``gandiva``'s ``dataset_affinity`` runs jobs of one dataset in the same time slices). No job
declares anything: the name is the one its loader reads under.

    /microco/cache/warm/<job id>  ->  {"node", "ok", "chunks", "error"}

The cache server of the host a job migrates to writes it when the warm it was asked for (the
scheduler's ``migrating`` phase) is over: the job's working set is there as far as its
allocation allows (``ok``), or why not (``error``). The scheduler deletes it when it moves a
job and holds the job's restart on the new host until it shows (or a deadline passes).
"""

from __future__ import annotations

from microco.common.kv import KV

JOB_DATASETS_PREFIX = "/microco/cache/jobs/"
WARM_PREFIX = "/microco/cache/warm/"


def publish_job_dataset(kv: KV, job_id: str, dataset: str, node: str) -> None:
    kv.put_json(JOB_DATASETS_PREFIX + job_id, {"dataset": dataset, "node": node})


def forget_job_dataset(kv: KV, job_id: str) -> None:
    kv.delete(JOB_DATASETS_PREFIX + job_id)


def job_dataset(kv: KV, job_id: str) -> str:
    """The dataset ``job_id`` reads ("" when no cache server knows it)."""
    doc = kv.get_json(JOB_DATASETS_PREFIX + job_id)
    return str(doc.get("dataset") or "") if isinstance(doc, dict) else ""


def job_datasets(kv: KV) -> dict[str, str]:
    """Job id -> the dataset it reads, for every job a cache server has registered."""
    out: dict[str, str] = {}
    for key, doc in kv.get_prefix_json(JOB_DATASETS_PREFIX):
        if isinstance(doc, dict) and doc.get("dataset"):
            out[key[len(JOB_DATASETS_PREFIX) :]] = str(doc["dataset"])
    return out


def report_warm(kv: KV, job_id: str, node: str, chunks: int, error: str = "") -> None:
    """``node``'s cache server is done warming for ``job_id`` (moving in): ``chunks`` of its
    dataset held there; ``error`` says why the warm could not be done."""
    doc = {"node": node, "ok": not error, "chunks": chunks, "error": error}
    kv.put_json(WARM_PREFIX + job_id, doc)


def warm_report(kv: KV, job_id: str) -> dict[str, object] | None:
    """The last warm report for ``job_id`` (None: none since the scheduler moved it)."""
    doc = kv.get_json(WARM_PREFIX + job_id)
    return doc if isinstance(doc, dict) else None


def forget_warm(kv: KV, job_id: str) -> None:
    kv.delete(WARM_PREFIX + job_id)
