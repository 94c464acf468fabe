"""Stored size beside the Parquet files a table was loaded from (the issue's storage target:
the store's three replicas within 1.3x of three Parquet copies)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def storage_report(tables: Iterable[Mapping[str, Any]], parquet: Mapping[str, str | Path]) -> dict[str, Any]:
    """``{"bytes", "parquet3_bytes", "ratio"}`` for the tables named in ``parquet`` (table name ->
    the Parquet file it was loaded from): ``bytes`` is what the catalog counts for their extents
    (all three replicas, as written on the nodes' disks), ``parquet3_bytes`` three times the files'
    sizes. ``tables`` is ``StoreClient.list_tables()``."""
    by_name = {t["name"]: t for t in tables}
    missing = sorted(set(parquet) - set(by_name))
    if missing:
        raise ValueError(f"no such tables in the store: {missing}")
    stored = sum(int(by_name[n]["bytes"]) for n in parquet)
    parquet3 = 3 * sum(os.path.getsize(p) for p in parquet.values())
    return {
        "bytes": stored,
        "parquet3_bytes": parquet3,
        "ratio": round(stored / parquet3, 3) if parquet3 else None,
    }
