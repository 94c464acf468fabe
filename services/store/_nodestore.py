"""What a store node does with its data directory: write and read extents (verifying checksums),
run query tasks next to the data, hold shuffle buckets, rebuild lost extents from peers' buckets.

Transport-free: the Flight server wraps it for real; the in-process cluster calls it directly."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa

from microco.common.errors import InvalidArgument, MicrocoError, NotFound, ResourceExhausted

from . import _exec
from ._cancel import MAX_CANCEL_IDS, CancelToken, TaskCancelled, TaskRegistry
from ._layout import (
    DEFAULT_COMPRESSION,
    EXTENT_LAYOUT,
    OpenExtent,
    bucketed_extents,
    check_codec,
    check_layout,
    file_checksum,
    open_extent,
    sorted_column,
    write_extent,
    write_options,
)
from ._limits import safe_path
from ._partition import PartitionSpec
from ._residency import column_ranges, file_residency

log = logging.getLogger(__name__)

# extent reads one warm-up may ask for (``warm``)
MAX_WARM_READS = 4096
OPEN_EXTENTS = 256  # extents a node keeps open (memory-mapped) between queries
# bytes of decompressed batches those open extents may hold together (--extent-cache-mb)
CACHE_BYTES = 1 << 30

# fetch(address, request) -> table: read a peer's extent bucket or shuffle bucket.
PeerFetch = Callable[[str, dict[str, Any]], pa.Table]


class CorruptExtent(MicrocoError):
    """An extent file's bytes do not match its checksum: it is not served, and must be rebuilt."""

    grpc_code = grpc.StatusCode.DATA_LOSS
    http_status = 500


def extent_replica(extent_id: str) -> int | None:
    """The replica of an extent by its id (``s000001-r2-p0003-...``, ``new_extent_id``)."""
    parts = extent_id.split("-")
    if len(parts) > 1 and parts[1][:1] == "r" and parts[1][1:] in ("0", "1", "2"):
        return int(parts[1][1:])
    return None


class NodeStore:
    def __init__(
        self,
        name: str,
        data_dir: str | Path,
        fetch: PeerFetch | None = None,
        compression: str | None = DEFAULT_COMPRESSION,
        cache_bytes: int = CACHE_BYTES,
        open_extents: int = OPEN_EXTENTS,
        layout: int = EXTENT_LAYOUT,
    ) -> None:
        self.name = name
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a mount not ours: its owner decides
            os.chmod(self.data_dir, 0o700)  # extents are readable through the store's checks only
        self.fetch = fetch
        write_options(compression)  # an unknown codec fails here, not at the first write
        self.compression = compression
        self.layout = check_layout(layout)  # of the extent files it writes (either reads)
        self._verified: dict[str, tuple[int, int, str]] = {}
        # column-major extents' column names and ranges by path, with the file version they were
        # read from (``residency``)
        self._ranges: dict[str, tuple[tuple[int, int], Any]] = {}
        # open extents by path, each with the file version (mtime, size) it was opened from:
        # a hot extent is not re-opened (footer, index) nor decompressed again per query. LRU,
        # bounded twice: at most `open_extents` maps, and at most `cache_bytes` of decompressed
        # batches (compressed extents) held together; `_charged` is what each one was counted.
        self._open: OrderedDict[str, tuple[int, int, OpenExtent]] = OrderedDict()
        self._charged: dict[str, int] = {}
        self.cache_bytes = cache_bytes
        self.open_extents = open_extents
        self.resident_bytes = 0
        self._shuffle: dict[tuple[str, str, int], pa.Table] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0
        # table -> [replica 0, 1, 2]: Arrow bytes of the columns read from its extents here
        # (decoded, or from the cache), since the node started: which replica serves the reads
        # (``microco store nodes``; an operator choosing which replica to give a faster codec)
        self.read_by_replica: dict[str, list[int]] = {}
        # the query tasks running, by the id the coordinator gave them, to cancel (``_cancel``)
        self.tasks = TaskRegistry()

    # ------------------------------------------------------------------ extents
    def path(self, table: str, extent_id: str) -> Path:
        if not isinstance(extent_id, str):
            raise InvalidArgument("an extent id must be a string")
        return safe_path(self.data_dir, "tables", table, extent_id + ".arrow")

    def put_extent(
        self, table: str, extent_id: str, rows: pa.Table, buckets: list[list[int]], codec: str = ""
    ) -> dict[str, Any]:
        """Write an extent with ``codec`` (its replica's, from the catalog; "": this node's
        ``compression``, the default)."""
        p = self.path(table, extent_id)
        codec = codec or self.compression or "none"
        try:
            check_codec(codec)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        try:
            size, checksum, sized = write_extent(p, rows, buckets, codec, self.layout)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ResourceExhausted(
                    f"store node {self.name}: no space left for extent {table}/{extent_id} under "
                    f"{self.data_dir} ({exc.strerror})"
                ) from exc
            raise
        st = p.stat()
        with self._lock:
            self._verified[str(p)] = (st.st_mtime_ns, st.st_size, checksum)
        return {"bytes": size, "checksum": checksum, "buckets": sized, "rows": rows.num_rows, "codec": codec}

    def verify(self, table: str, extent_id: str, checksum: str | None, force: bool = False) -> Path:
        """The extent's path once its bytes match ``checksum``. Reads trust a cached verification
        of the same file version (mtime, size); ``force`` (the scrub) re-hashes every byte, since
        bit rot or an overwrite that restores the mtime leaves both unchanged."""
        p = self.path(table, extent_id)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise NotFound(f"node {self.name} has no extent {table}/{extent_id}") from None
        if not checksum:
            return p
        key = str(p)
        with self._lock:
            cached = self._verified.get(key)
        if cached == (st.st_mtime_ns, st.st_size, checksum) and not force:
            return p
        actual = file_checksum(p)
        if actual != checksum:
            self._forget(p)
            raise CorruptExtent(f"corrupt extent {table}/{extent_id} on node {self.name}: checksum mismatch")
        with self._lock:
            self._verified[key] = (st.st_mtime_ns, st.st_size, checksum)
        return p

    def read(
        self,
        table: str,
        extent_id: str,
        bucket: Sequence[int] | None = None,
        columns: Sequence[str] | None = None,
        checksum: str | None = None,
        rows: Sequence[int] | None = None,
    ) -> pa.Table:
        """An extent's rows (of one sub-bucket selection ``bucket``; of ``columns``); with
        ``rows``, only those (ascending positions into that selection), read from the batches
        holding them (``OpenExtent.take``)."""
        p = self.verify(table, extent_id, checksum)
        ext = self._opened(p)
        sel = tuple(bucket) if bucket is not None else None
        if rows is None:
            t, n = ext.select(sel, columns)  # type: ignore[arg-type]
        else:
            if not isinstance(rows, (list, tuple)) or not all(
                isinstance(r, int) and not isinstance(r, bool) for r in rows
            ):
                raise InvalidArgument("a read's rows must be a list of row positions")
            try:
                t, n = ext.take(sel, columns, sorted(rows))  # type: ignore[arg-type]
            except IndexError as exc:
                raise InvalidArgument(f"extent {table}/{extent_id}: {exc}") from None
        replica = extent_replica(extent_id)
        with self._lock:
            self.bytes_read += n
            if replica is not None:
                self.read_by_replica.setdefault(table, [0, 0, 0])[replica] += t.nbytes
            self._charge(str(p), ext)
        return t

    def read_request(self, req: dict[str, Any]) -> pa.Table:
        """``read`` of a peer's request (``read_source``'s remote form: a Flight ticket, or the
        in-process transport's call)."""
        return self.read(
            req["table"],
            req["extent"],
            req.get("bucket"),
            req.get("columns"),
            req.get("checksum"),
            req.get("rows"),
        )

    def _opened(self, p: Path) -> OpenExtent:
        st = p.stat()
        key = str(p)
        with self._lock:
            hit = self._open.get(key)
            if hit is not None and hit[:2] == (st.st_mtime_ns, st.st_size):
                self._open.move_to_end(key)
                return hit[2]
        ext = open_extent(p)
        with self._lock:
            hit = self._open.get(key)
            if hit is not None and hit[:2] == (st.st_mtime_ns, st.st_size):
                # another read opened it meanwhile (two reads of one cold extent at once: a query
                # and a warm-up, ``warm``, or two queries): its batches are decoded once, there
                # (each read waits on the extent's lock for the other's decoding), not twice
                self._open.move_to_end(key)
                return hit[2]
            self._drop_open(key)
            self._open[key] = (st.st_mtime_ns, st.st_size, ext)
            self._charge(key, ext)
        return ext

    def _charge(self, key: str, ext: OpenExtent) -> None:
        """Count what ``ext`` holds now, and evict least recently used extents until the cache
        is within its bounds (the one just read too, when it alone is over the byte bound: the
        caller's table keeps its batches alive, the cache does not). Under ``_lock``."""
        hit = self._open.get(key)
        if hit is None or hit[2] is not ext:
            return  # forgotten or replaced while it was read: not the cache's any more
        self._open.move_to_end(key)
        self.resident_bytes += ext.resident - self._charged.get(key, 0)
        self._charged[key] = ext.resident
        while self._open and (self.resident_bytes > self.cache_bytes or len(self._open) > self.open_extents):
            self._drop_open(next(iter(self._open)))

    def _drop_open(self, key: str) -> None:
        """Under ``_lock``."""
        self._open.pop(key, None)
        self.resident_bytes -= self._charged.pop(key, 0)

    def _forget(self, p: Path) -> None:
        with self._lock:
            self._verified.pop(str(p), None)
            self._ranges.pop(str(p), None)
            self._drop_open(str(p))

    def delete(self, table: str, extent_id: str) -> bool:
        p = self.path(table, extent_id)
        self._forget(p)
        try:
            p.unlink()
            return True
        except FileNotFoundError:
            return False

    def collect_garbage(self, keep: dict[str, Sequence[str]], min_age_s: float) -> dict[str, Any]:
        """Delete extent files the catalog does not reference here (``keep``: table -> extent ids
        on this node), and temporary files of interrupted writes, once older than ``min_age_s``.

        Orphans come from append attempts that failed half-way, rebuilds that lost their commit,
        dropped tables whose node was down, and a node that returns after its extents were rebuilt
        elsewhere. The age floor protects extents of an append or rebuild still in flight (written,
        not yet committed): they are young. Returns ``{"deleted": ["table/file", ...], "bytes": n}``."""
        root = self.data_dir / "tables"
        deleted: list[str] = []
        freed = 0
        now = time.time()
        if not root.exists():
            return {"deleted": deleted, "bytes": 0}
        for tdir in sorted(root.iterdir()):
            if not tdir.is_dir():
                continue
            wanted = set(keep.get(tdir.name, ()))
            for f in sorted(tdir.iterdir()):
                is_tmp = ".tmp-" in f.name
                if not is_tmp and (not f.name.endswith(".arrow") or f.name[: -len(".arrow")] in wanted):
                    continue
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                if now - st.st_mtime < min_age_s:
                    continue
                self._forget(f)
                try:
                    f.unlink()
                except FileNotFoundError:
                    continue
                deleted.append(f"{tdir.name}/{f.name}")
                freed += st.st_size
            if not any(tdir.iterdir()) and tdir.name not in keep:
                try:
                    tdir.rmdir()
                except OSError:
                    pass
        if deleted:
            log.info("node %s: %d orphan files (%d bytes) deleted", self.name, len(deleted), freed)
        return {"deleted": deleted, "bytes": freed}

    def drop_table(self, table: str) -> None:
        # the table's directory only: a name from the request never reaches rmtree unchecked
        root = safe_path(self.data_dir, "tables", table)
        with self._lock:
            for k in [k for k in self._open if Path(k).parent == root]:
                self._drop_open(k)
        shutil.rmtree(root, ignore_errors=True)

    def residency(self, tables: Sequence[str]) -> dict[str, Any]:
        """What of the extents of ``tables`` here is in memory (``_residency``): per table, the
        column names of its column-major extents, and per extent file ``[size, bytes in the page
        cache, each column's file bytes or None, each column's bytes in the page cache or None,
        {column: share of its batches held decoded}, (its own column names, when not the
        table's)]``. One ``mincore`` a file; the column ranges are read from a file's header once
        per file version and kept."""
        out: dict[str, Any] = {}
        with self._lock:
            open_now = {k: v[2] for k, v in self._open.items()}
        for table in tables:
            root = safe_path(self.data_dir, "tables", table)
            try:
                entries = list(os.scandir(root))
            except OSError:
                continue
            names: list[str] | None = None
            extents: dict[str, Any] = {}
            for de in entries:
                if not de.name.endswith(".arrow"):
                    continue
                try:
                    st = de.stat()
                    key = (st.st_mtime_ns, st.st_size)
                    hit = self._ranges.get(de.path)
                    if hit is None or hit[0] != key:
                        hit = (key, column_ranges(Path(de.path)))
                        self._ranges[de.path] = hit
                    got = file_residency(de.path, st.st_size, hit[1][1] if hit[1] is not None else None)
                    if got is None:
                        continue
                except (OSError, ValueError):
                    continue  # deleted or replaced meanwhile: not reported
                resident, col_resident = got
                decoded: dict[str, float] = {}
                ext = open_now.get(de.path)
                if ext is not None and ext.compressed:
                    decoded = ext.decoded_shares()
                rec: list[Any] = [st.st_size, resident, None, None, decoded]
                if hit[1] is not None:
                    cols, ranges = hit[1]
                    rec[2] = [n for _, n in ranges]
                    rec[3] = col_resident
                    if names is None:
                        names = cols
                    if cols != names:
                        rec.append(cols)
                extents[de.name[: -len(".arrow")]] = rec
            out[table] = {"columns": names or [], "extents": extents}
        # the extent cache's capacity: a read of more decoded bytes than it holds evicts, as it goes,
        # what it would find there (least recently used), so the planner counts what it holds only
        # for reads that fit
        return {"tables": out, "cache_bytes": self.cache_bytes}

    def stats(self) -> dict[str, Any]:
        n = size = 0
        root = self.data_dir / "tables"
        if root.exists():
            for dirpath, _, files in os.walk(root):
                for f in files:
                    if f.endswith(".arrow"):
                        n += 1
                        size += os.path.getsize(os.path.join(dirpath, f))
        return {
            "extents": n,
            "bytes": size,
            "bytes_read": self.bytes_read,
            "open_extents": len(self._open),
            "cache_bytes": self.resident_bytes,
            **self.tasks.stats(),
        }

    # ------------------------------------------------------------------ query tasks
    def _token(self, task: dict[str, Any]) -> CancelToken | None:
        tid = task.get("tid")
        if tid is None:
            return None
        if not isinstance(tid, str) or not 0 < len(tid) <= 64:
            raise InvalidArgument("a task's 'tid' must be a string of 1..64 characters")
        token = self.tasks.start(tid)
        try:
            token.check()
        except TaskCancelled as exc:
            self._ended(token, exc)
            raise
        return token

    def run(self, task: dict[str, Any]) -> pa.Table:
        token = self._token(task)
        with self._running(token):
            out = _exec.run_task(_NodeEnv(self, task.get("addresses", {}), token), task)
            if token is not None:
                token.check()
        return out

    def run_stream(self, task: dict[str, Any]) -> pa.RecordBatchReader:
        """``run`` as record batches (a ``sql`` task's result is never held whole: what Flight
        serves). A task with an id (``tid``) runs until its stream is read to its end, dropped,
        or cancelled (``cancel``: its next batch raises ``TaskCancelled``)."""
        token = self._token(task)
        try:
            reader = _exec.run_task_stream(_NodeEnv(self, task.get("addresses", {}), token), task)
        except BaseException as exc:
            if token is not None:
                self._ended(token, exc)
            raise
        if token is None:
            return reader
        tok: CancelToken = token

        def batches() -> Iterator[pa.RecordBatch]:
            error: BaseException | None = None
            try:
                for b in reader:
                    tok.check()
                    yield b
            except BaseException as exc:
                error = exc
                raise
            finally:
                reader.close()
                self._ended(tok, error)

        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    @contextlib.contextmanager
    def _running(self, token: CancelToken | None) -> Iterator[None]:
        """A task's work under its token (None: a task without one): ended with the error that
        ends it, or as done when it returns."""
        try:
            yield
        except BaseException as exc:
            if token is not None:
                self._ended(token, exc)
            raise
        if token is not None:
            self.tasks.end(token)

    def _ended(self, token: CancelToken, error: BaseException | None) -> None:
        self.tasks.end(token, error)
        if isinstance(error, TaskCancelled):
            _exec.release_unused()  # (its inputs went with its frames: their memory handed back)

    def cancel(self, tids: Any) -> dict[str, Any]:
        """Cancel the query tasks ``tids`` (``_cancel``): those running stop where they stand,
        the others end at once if they still arrive. Harmless for a finished or unknown task."""
        if not isinstance(tids, list) or len(tids) > MAX_CANCEL_IDS:
            raise InvalidArgument(f"cancel: 'tasks' must be a list of at most {MAX_CANCEL_IDS} task ids")
        if not all(isinstance(t, str) and 0 < len(t) <= 64 for t in tids):
            raise InvalidArgument("cancel: each task id must be a string of 1..64 characters")
        out = self.tasks.cancel(tids)
        if out["cancelled"]:
            log.info("node %s: cancelled %d running task(s)", self.name, len(out["cancelled"]))
        return out

    def warm(self, reads: Any, tid: Any = None) -> dict[str, Any]:
        """Decode into this node's extent cache what ``reads`` select (each an extent of this node
        with its ``bucket`` and ``columns``, as a task's source gives them), answering nothing
        else: the coordinator's warm-up of a hedge's reads while the node a query waits on has
        missed a liveness probe (``StoreCore._warm``), so that the hedge, if it comes, finds its
        extents decoded. Under task id ``tid`` (``cancel`` stops it between extents; ``probe``
        sees it). Reads nothing from peers; counts in no read statistic (``read_by_replica``:
        the reads queries made). Returns the extents warmed and their decoded bytes."""
        if not isinstance(reads, list) or len(reads) > MAX_WARM_READS:
            raise InvalidArgument(f"warm: 'reads' must be a list of at most {MAX_WARM_READS} extent reads")
        for r in reads:
            if (
                not isinstance(r, dict)
                or not isinstance(r.get("table"), str)
                or not isinstance(r.get("extent"), str)
            ):
                raise InvalidArgument("warm: each read names its 'table' and 'extent'")
            b, cols = r.get("bucket"), r.get("columns")
            if b is not None and not (
                isinstance(b, list)
                and len(b) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in b)
            ):
                raise InvalidArgument("warm: a read's 'bucket' is null or [position, partition]")
            if cols is not None and not (isinstance(cols, list) and all(isinstance(c, str) for c in cols)):
                raise InvalidArgument("warm: a read's 'columns' is null or a list of column names")
        token = self._token({"tid": tid}) if tid is not None else None
        extents = decoded = 0
        with self._running(token):
            for r in reads:
                if token is not None:
                    token.check()
                p = self.verify(r["table"], r["extent"], r.get("checksum"))
                ext = self._opened(p)
                b = r.get("bucket")
                try:
                    t, _ = ext.select(tuple(b) if b is not None else None, r.get("columns"))
                except KeyError as exc:
                    raise InvalidArgument(f"warm: extent {r['table']}/{r['extent']}: {exc}") from None
                extents += 1
                decoded += t.nbytes
                with self._lock:
                    self._charge(str(p), ext)
                if token is not None:
                    token.bytes_read += t.nbytes
                del t
        return {"extents": extents, "bytes": decoded}

    def probe(self, tids: Any) -> dict[str, Any]:
        """Which of the query tasks ``tids`` run here, for how long and what each has read
        (``_cancel.TaskRegistry.probe``): the coordinator's question to a node whose fragment
        runs long; answering at all says the node is there."""
        if not isinstance(tids, list) or len(tids) > MAX_CANCEL_IDS:
            raise InvalidArgument(f"probe: 'tasks' must be a list of at most {MAX_CANCEL_IDS} task ids")
        if not all(isinstance(t, str) and 0 < len(t) <= 64 for t in tids):
            raise InvalidArgument("probe: each task id must be a string of 1..64 characters")
        return self.tasks.probe(tids)

    def shuffle_take(self, qid: str, tag: str, bucket: int) -> pa.Table:
        with self._lock:
            t = self._shuffle.pop((qid, tag, bucket), None)
        if t is None:
            raise NotFound(f"node {self.name} has no shuffle bucket {qid}/{tag}/{bucket}")
        return t

    def shuffle_drop(self, qid: str) -> int:
        with self._lock:
            keys = [k for k in self._shuffle if k[0] == qid]
            for k in keys:
                del self._shuffle[k]
        return len(keys)

    def read_source(self, src: dict[str, Any], columns: Sequence[str] | None) -> pa.Table:
        if src["node"] == self.name:
            return self.read(
                src["table"], src["extent"], src.get("bucket"), columns, src.get("checksum"), src.get("rows")
            )
        if self.fetch is None:
            raise InvalidArgument(f"node {self.name} cannot read remote extent {src['extent']}")
        return self.fetch(
            src["address"],
            {
                "op": "read",
                "table": src["table"],
                "extent": src["extent"],
                "bucket": src.get("bucket"),
                "columns": list(columns) if columns is not None else None,
                "checksum": src.get("checksum"),
                "rows": src.get("rows"),
            },
        )

    # ------------------------------------------------------------------ recovery
    def rebuild(self, req: dict[str, Any]) -> dict[str, Any]:
        """Rebuild extent ``req['extent']`` (replica ``r``) from buckets of another replica (or,
        recoding, from the extent itself), written with ``req['codec']`` (its replica's)."""
        specs = [PartitionSpec.from_json(s) for s in req["specs"]]
        r = req["replica"]
        parts = [self.read_source(src, None) for src in req["sources"]]
        bytes_read = sum(t.nbytes for t in parts)
        rows = _exec.concat(parts)
        if rows.num_rows != req["rows"]:
            raise MicrocoError(
                f"rebuild of {req['extent']}: sources hold {rows.num_rows} rows, the catalog says {req['rows']}"
            )
        sort = bool(req.get("sort"))  # (the lost extent's layout; a coordinator before session 38: no)
        ext = bucketed_extents(rows, specs, replicas=[r], sort=sort)
        if len(ext) != 1 or next(iter(ext))[1] != req["partition"]:
            raise MicrocoError(
                f"rebuild of {req['extent']}: rows do not all fall in partition {req['partition']}"
            )
        ((_, (ordered, index)),) = ext.items()
        out = self.put_extent(req["table"], req["new_extent"], ordered, index, req.get("codec") or "")
        out["bytes_read"] = bytes_read
        out["sorted"] = sorted_column(specs[r], rows.schema) if sort else ""
        return out


class _NodeEnv:
    """Where a task runs: its node's store, its peers' addresses and its cancel token, checked
    before and after each piece it reads (an extent, a peer's bucket), so a cancelled task stops
    between pieces; the token interrupts its DuckDB queries (``attach``)."""

    def __init__(self, store: NodeStore, addresses: dict[str, str], token: CancelToken | None = None) -> None:
        self.store, self.addresses, self.cancel = store, addresses, token

    def check(self) -> None:
        if self.cancel is not None:
            self.cancel.check()

    def read_source(self, source: dict[str, Any], columns: Sequence[str] | None) -> pa.Table:
        self.check()
        out = self.store.read_source(source, columns)
        self.check()
        if self.cancel is not None:
            self.cancel.bytes_read += out.nbytes  # (what a ``probe`` says it has read)
        return out

    def shuffle_put(self, qid: str, tag: str, bucket: int, table: pa.Table) -> None:
        self.check()
        with self.store._lock:
            self.store._shuffle[(qid, tag, bucket)] = table

    def shuffle_get(self, peer: str, qid: str, tag: str, bucket: int) -> pa.Table:
        self.check()
        if peer == self.store.name:
            return self.store.shuffle_take(qid, tag, bucket)
        if self.store.fetch is None:
            raise InvalidArgument("no peer transport")
        return self.store.fetch(
            self.addresses[peer], {"op": "shuffle_take", "qid": qid, "tag": tag, "bucket": bucket}
        )


def encode(req: dict[str, Any]) -> bytes:
    return json.dumps(req, default=str).encode()
