"""An append of rows the driver holds (an Arrow table) as one idempotent transaction, committed by delta-rs: no
Spark job. For small sets of rows that are on the driver anyway, such as a batch's dead letters."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from onceflow.jobs.delta.commit_log import holds_batch


def append_arrow_once(table: DeltaTable, rows: pa.Table, app_id: str, version: int, metadata: dict[str, Any]) -> bool:
    """Append `rows` to `table` as the transaction `(app_id, version)`, on the very table version `table` was loaded
    at: any commit since, whatever its app id, makes it fail (`CommitFailedError`), never a rebase (the rows were
    decided against that version). False (nothing written) when the table has committed the transaction already.

    The commit carries `metadata` as its user metadata, and delta-rs's metrics (`num_added_rows`; see
    `onceflow.jobs.delta.commit_log.rows_appended`): a replay reports the figures of the commit that did the work.
    """
    if holds_batch(table.table_uri, app_id, version):
        return False
    schema = pa.schema(table.schema().to_arrow())
    write_deltalake(
        table, rows.select(schema.names).cast(schema), mode="append",
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": json.dumps(metadata, sort_keys=True)},
            app_transactions=[Transaction(app_id, version)],
            max_commit_retries=0,
        ),
    )
    return True
