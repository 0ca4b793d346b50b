"""Record IDs straight from a table's Delta log and data files (delta-rs and pyarrow, no Spark, on local disk or GCS):
what commits changed, for the ID filters to catch up with them."""

from __future__ import annotations

from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.jobs.dedup.buckets import Bucketing
from onceflow.resources.delta_storage import commit_actions, table_files


def changes_since(
    uri: str, since: int, latest: int, bucketing: Bucketing
) -> tuple[pa.Table, set[int] | None]:
    """What data-changing commits of the table at `uri` after `since` (up to `latest`) did: `record_id, bucket` of
    every row they added, and the buckets they removed rows from (None when a removal names no bucket).

    OPTIMIZE rewrites rows already counted (`dataChange` false) and changes nothing here. A file added with a
    deletion vector holds rows the table does not, so its bucket counts as one rows were removed from."""
    adds: list[dict] = []
    emptied: set[int] | None = set()
    for version in range(since + 1, latest + 1):
        for action in _data_changes(uri, version):
            if "add" in action and not action["add"].get("deletionVector"):
                adds.append(action["add"])
                continue
            bucket = bucketing.removed_from((action.get("add") or action.get("remove") or {}).get("partitionValues", {}))
            if bucket is None or emptied is None:
                emptied = None
            else:
                emptied.add(int(bucket))
    return _read_adds(uri, adds, bucketing), emptied


def _data_changes(uri: str, version: int) -> list[dict]:
    """A commit's `add` and `remove` actions that change the table's rows."""
    return [a for a in commit_actions(uri, version)
            if any(kind in a and a[kind].get("dataChange", True) for kind in ("add", "remove"))]


def _read_adds(uri: str, adds: list[dict], bucketing: Bucketing) -> pa.Table:
    files, root = table_files(uri)
    parts = []
    for add in adds:
        part = pq.read_table(f"{root}/{unquote(add['path'])}", columns=["record_id", *bucketing.columns],
                             filesystem=files)
        buckets = bucketing.of(part, add.get("partitionValues") or {})
        parts.append(pa.table({"record_id": part["record_id"], "bucket": pa.array(buckets, pa.int64())}))
    if not parts:
        return pa.table({"record_id": pa.array([], pa.string()), "bucket": pa.array([], pa.int64())})
    return pa.concat_tables(parts)
