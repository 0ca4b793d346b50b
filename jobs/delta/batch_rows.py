"""The rows one batch inserted into a table, read from the files its own commit added (pyarrow, no Spark, on local
disk or GCS): stable input, whatever was committed since, and a read that costs the batch's size, not the table's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from onceflow.jobs.delta.commit_log import batch_versions
from onceflow.resources.delta_storage import commit_actions, delta_table, table_files


def own_version(uri: str, app_id: str, batch: int, hint: int | None = None) -> int | None:
    """The version of the commit of batch `batch` of `app_id`: `hint` when that commit is it (one read of its log
    file), else looked up in the table's history; None when the table holds no such commit."""
    if hint is not None:
        try:
            info = next((a["commitInfo"] for a in commit_actions(uri, hint) if "commitInfo" in a), {})
            carried = json.loads(info.get("userMetadata") or "{}")
        except (OSError, json.JSONDecodeError):
            carried = {}
        if isinstance(carried, dict) and (carried.get("onceflow_source"), carried.get("onceflow_batch")) == (
                app_id, batch):
            return hint
    return batch_versions(uri, app_id, [batch]).get(batch)


def inserted_rows(uri: str, version: int, batch: int, columns: Sequence[str]) -> pa.Table:
    """`columns` of the rows with `batch_id = batch` among the files commit `version` added."""
    files, root = table_files(uri)
    schema = pa.schema(delta_table(uri, version).schema().to_arrow())
    parts = [schema.empty_table().select(list(columns))]
    for action in commit_actions(uri, version):
        add = action.get("add")
        if add is None or not add.get("dataChange", True):
            continue
        with files.open_input_file(f"{root}/{unquote(add['path'])}") as handle:
            parquet = pq.ParquetFile(handle)
            held = set(parquet.schema_arrow.names)
            part = parquet.read(columns=[c for c in (*columns, "batch_id") if c in held])
        part = part.filter(pc.equal(part["batch_id"], batch))
        # A field the table gained after this file was written reads as NULL, as the table reads it.
        parts.append(pa.table({name: part[name] if name in part.column_names
                               else pa.nulls(part.num_rows, schema.field(name).type) for name in columns}))
    return pa.concat_tables(parts, promote_options="default")
