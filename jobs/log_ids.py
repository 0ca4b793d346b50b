"""Record IDs straight from a raw table's Delta log and data files (delta-rs and pyarrow, no Spark): the rows
that commits added, for the ID filters to catch up and for their exact lookups."""

from __future__ import annotations

import json
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

RECENT_COMMITS = 8
RECENT_ROWS = 1_000_000


def ids_added_since(table: DeltaTable, since: int, latest: int) -> pa.Table:
    """`record_id, time_bucket` of every row that data-changing commits after `since` (up to `latest`) added."""
    return _read_adds(table, [add for version in range(since + 1, latest + 1) for add in _data_adds(table, version)])


def recent_ids(table: DeltaTable, version: int) -> pa.Array:
    """The record IDs of the newest commits up to `version`: at most `RECENT_COMMITS` of them, newest first, and
    only while they hold `RECENT_ROWS` rows in all (a bulk load is not "recent" enough to be worth reading)."""
    adds: list[dict] = []
    rows = 0
    for v in range(version, max(-1, version - RECENT_COMMITS), -1):
        commit = _data_adds(table, v)
        rows += sum(json.loads(a.get("stats") or '{"numRecords": 1e18}').get("numRecords", 1e18) for a in commit)
        if rows > RECENT_ROWS:
            break
        adds += commit
    return _read_adds(table, adds)["record_id"].combine_chunks()


def _data_adds(table: DeltaTable, version: int) -> list[dict]:
    """The files a commit added with new rows (OPTIMIZE rewrites rows already counted)."""
    root = table.table_uri.removeprefix("file://")
    with open(f"{root}/_delta_log/{version:020d}.json", encoding="utf-8") as entries:
        adds = [json.loads(line).get("add") for line in entries]
    return [a for a in adds if a is not None and a.get("dataChange", True)]


def _read_adds(table: DeltaTable, adds: list[dict]) -> pa.Table:
    root = table.table_uri.removeprefix("file://")
    parts = []
    for add in adds:
        part = pq.read_table(f"{root}/{unquote(add['path'])}", columns=["record_id"])
        bucket = int(add["partitionValues"]["time_bucket"])
        parts.append(part.append_column("time_bucket", pa.array([bucket] * len(part), pa.int64())))
    if not parts:
        return pa.table({"record_id": pa.array([], pa.string()), "time_bucket": pa.array([], pa.int64())})
    return pa.concat_tables(parts)
