"""An append of rows this process holds (an Arrow table) as one idempotent transaction, written and committed by
delta-rs: no Spark job. For a batch's dead letters (on the driver anyway), and for a batch's rows over Spark Connect
(`onceflow.jobs.delta.transactions.append_once`), where a Spark write would cost a Delta commit of its own first."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    WriterProperties,
    write_deltalake,
)

from onceflow.jobs.delta.commit_log import holds_batch
from onceflow.resources.delta_storage import made_commit
from onceflow.resources.spark import PER_RECORD_COLUMNS

ARROW_UNWRITABLE = frozenset({"variantType", "variantType-preview"})
"""Table features whose columns delta-rs cannot write: such a table's rows are written by Delta's writer."""
DELTA_RS_CHECKPOINT_INTERVAL = 100
"""delta-rs's checkpoint interval for a table that does not set `delta.checkpointInterval`."""


def post_commit_hooks(table: DeltaTable) -> PostCommitHookProperties:
    """What delta-rs does after a commit on `table` (at the version before it): a checkpoint every
    `delta.checkpointInterval` commits, and with it, only then, the log entries past the table's retention removed
    (if the table allows), as Spark's Delta does. delta-rs would clean the log after every commit, listing all of
    it, a cost that grows with the log."""
    interval = int(table.metadata().configuration.get("delta.checkpointInterval", DELTA_RS_CHECKPOINT_INTERVAL))
    checkpointed = (table.version() + 2) % interval == 0  # delta-rs checkpoints version v when interval divides v + 1
    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=None if checkpointed else False)


def arrow_writable(table: DeltaTable) -> bool:
    """Whether delta-rs writes every column of `table` (no VARIANT among them)."""
    return not ARROW_UNWRITABLE & set(table.protocol().writer_features or ())


def append_arrow_once(
    table: DeltaTable, rows: pa.Table, app_id: str, version: int, metadata: dict[str, Any], rebase: bool = False
) -> bool:
    """Append `rows` to `table` as the transaction `(app_id, version)`, on the very table version `table` was loaded
    at: any commit since, whatever its app id, makes it fail (`CommitFailedError`), never a rebase (the rows were
    decided against that version); with `rebase`, a commit since is rebased over unless it conflicts (it holds the
    same transaction, or redefined the table). False (nothing written) when the table has committed the
    transaction already.

    The commit carries `metadata` as its user metadata, and delta-rs's metrics (`num_added_rows`; see
    `onceflow.jobs.delta.commit_log.rows_appended`): a replay reports the figures of the commit that did the work.
    """
    if holds_batch(table.table_uri, app_id, version):
        return False
    schema = pa.schema(table.schema().to_arrow())
    # As Spark writes them (`onceflow.resources.spark.PARQUET_CONF`): no dictionary of a value unique to a record.
    plain = {name: ColumnProperties(dictionary_enabled=False) for name in PER_RECORD_COLUMNS if name in schema.names}
    write_deltalake(
        table, rows.select(schema.names).cast(schema), mode="append",
        writer_properties=WriterProperties(compression="SNAPPY", column_properties=plain),
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": json.dumps(metadata, sort_keys=True)},
            app_transactions=[Transaction(app_id, version)],
            max_commit_retries=None if rebase else 0,
        ),
        post_commithook_properties=post_commit_hooks(table),
    )
    made_commit(table.table_uri, table.version(), table.metadata().id, app_id, version)  # the table is at its commit
    return True
