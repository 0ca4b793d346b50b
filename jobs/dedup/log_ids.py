"""Record IDs straight from a raw table's Delta log and data files (delta-rs and pyarrow, no Spark, on local disk or
GCS): the rows that commits added, for the ID filters to catch up and for their exact lookups.

What one commit of one table added never changes, so the IDs read for it are kept per process (keyed by the
table's id, which a table re-created at the same path does not share): consecutive batches look up the same
recent commits, and each is read once instead of once per batch.
"""

from __future__ import annotations

import json
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from onceflow.resources.delta_storage import table_files, table_snapshot

RECENT_COMMITS = 8
RECENT_ROWS = 1_000_000
_KEPT_COMMITS = 4 * RECENT_COMMITS
_commit_ids: dict[tuple[str, int], pa.Array] = {}  # (table id, version) -> the record IDs that commit added


def ids_added_since(table: DeltaTable, since: int, latest: int) -> pa.Table:
    """`record_id, time_bucket` of every row that data-changing commits after `since` (up to `latest`) added."""
    return _read_adds(table, [add for version in range(since + 1, latest + 1) for add in _data_adds(table, version)])


def recent_ids(table: DeltaTable, version: int) -> list[pa.Array]:
    """The record IDs of the newest commits up to `version`, one array per commit: at most `RECENT_COMMITS` of
    them, newest first, and only while they hold `RECENT_ROWS` rows in all (a bulk load is not "recent" enough to
    be worth reading)."""
    parts: list[pa.Array] = []
    rows, table_id = 0, table.metadata().id
    for v in range(version, max(-1, version - RECENT_COMMITS), -1):
        commit = _data_adds(table, v)
        rows += sum(json.loads(a.get("stats") or '{"numRecords": 1e18}').get("numRecords", 1e18) for a in commit)
        if rows > RECENT_ROWS:
            break
        parts.append(_ids_of_commit(table, table_id, v, commit))
    return parts


def remember_commit_ids(path: str, version: int, ids: pa.Array | pa.ChunkedArray) -> None:
    """Keep `ids` as the record IDs that commit `version` of the table at `path` added: its writer knows them."""
    _keep((table_snapshot(path).metadata().id, version), ids)


def _ids_of_commit(table: DeltaTable, table_id: str, version: int, adds: list[dict]) -> pa.Array:
    key = (table_id, version)
    if key not in _commit_ids:
        _keep(key, _read_adds(table, adds)["record_id"])
    return _commit_ids[key]


def _keep(key: tuple[str, int], ids: pa.Array | pa.ChunkedArray) -> None:
    if len(_commit_ids) >= _KEPT_COMMITS:
        del _commit_ids[next(iter(_commit_ids))]  # the one kept longest
    _commit_ids[key] = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids


def _data_adds(table: DeltaTable, version: int) -> list[dict]:
    """The files a commit added with new rows (OPTIMIZE rewrites rows already counted)."""
    files, root = table_files(table.table_uri)
    with files.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as entries:
        adds = [json.loads(line).get("add") for line in entries.read().splitlines() if line.strip()]
    return [a for a in adds if a is not None and a.get("dataChange", True)]


def _read_adds(table: DeltaTable, adds: list[dict]) -> pa.Table:
    files, root = table_files(table.table_uri)
    parts = []
    for add in adds:
        part = pq.read_table(f"{root}/{unquote(add['path'])}", columns=["record_id"], filesystem=files)
        bucket = int(add["partitionValues"]["time_bucket"])
        parts.append(part.append_column("time_bucket", pa.array([bucket] * len(part), pa.int64())))
    if not parts:
        return pa.table({"record_id": pa.array([], pa.string()), "time_bucket": pa.array([], pa.int64())})
    return pa.concat_tables(parts)
