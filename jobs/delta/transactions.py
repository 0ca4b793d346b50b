"""Idempotent Delta commits: each commit carries a SetTransaction `(app_id, version)`.

Delta skips a write whose `(txnAppId, txnVersion)` the table has already seen, atomically with the commit, so a
replayed batch is a no-op before any row is compared. For SQL commands (MERGE) the ids travel as session
settings; they are set and cleared around exactly one command under a lock, so no two writers of this process
ever share them. Appends (`append_once`) have Delta's writer write the files (through a transaction on a classic
session, into a staging table over Spark Connect) and delta-rs commit them with the SetTransaction (see there).

Also here: how Delta names a lost commit race, and the retention every onceflow table is created with (what the
log says about commits is `onceflow.jobs.delta.commit_log`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, Transaction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from onceflow.jobs.delta.arrow_append import append_arrow_once, arrow_writable, post_commit_hooks
from onceflow.jobs.delta.commit_log import holds_batch
from onceflow.jobs.delta.schema_evolution import TableSchemaError, conform, conform_arrow
from onceflow.jobs.delta.staging import write_staged
from onceflow.jobs.delta.table_features import complete_protocol
from onceflow.resources.delta_storage import (
    made_commit,
    newest_version,
    storage_options,
    table_snapshot,
    writable_table,
)

_APP_ID = "spark.databricks.delta.write.txnAppId"
_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_lock = threading.Lock()
_created: set[str] = set()
_starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-delta-txn")
CREATE_RACE_CHECKS = 20
# How Delta names the conflicts of two writers committing at once (class names, or error classes over Connect).
_CONFLICTS = ("DELTA_CONCURRENT_", "ConcurrentAppendException", "ConcurrentTransactionException",
              "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException", "MetadataChangedException")


def is_concurrent_commit(error: BaseException) -> bool:
    """Whether `error` is Delta (Spark's or delta-rs's) refusing a commit because another writer committed first."""
    return isinstance(error, CommitFailedError) or any(marker in str(error) for marker in _CONFLICTS)


def create_table_once(
    path: str, schema: T.StructType, properties: dict[str, str], partitioned_by: tuple[str, ...] = ()
) -> None:
    """Create the Delta table at `path` unless it exists, when another writer may be creating it at the same moment
    (two first runs): whoever loses that race finds the table made, which is all it wanted.

    delta-rs writes the first commit: the same table Spark's `CREATE TABLE` makes (protocol and table features
    follow from the schema), without the planning and job a Spark command runs.
    """
    if path in _created and (("://" in path) or os.path.isdir(f"{path}/_delta_log")):
        return  # the common case: this process made or saw it, and it is still there
    try:
        complete_protocol(_table(path), schema)
        _created.add(path)
        return
    except TableNotFoundError:
        pass
    try:
        table = DeltaTable.create(path, Schema.from_json(schema.json()), mode="error",
                                  partition_by=list(partitioned_by) or None, configuration=properties,
                                  storage_options=storage_options(path))
    except Exception:
        # The winner of the race may still be writing its first commit when this create fails: give it a moment.
        for _ in range(CREATE_RACE_CHECKS):
            try:
                table = _table(path)
                break
            except TableNotFoundError:
                time.sleep(0.5)
        else:
            raise  # the create failed, and not because someone else created the table
    complete_protocol(table, schema)
    _created.add(path)


def delta_transaction(
    spark: SparkSession, app_id: str, version: int, metadata: dict[str, Any]
) -> AbstractContextManager[None]:
    """Run one Delta SQL command inside the block as the idempotent transaction `(app_id, version)`."""
    return _command_settings(spark, {_APP_ID: app_id, _VERSION: str(version),
                                     _USER_METADATA: json.dumps(metadata, sort_keys=True)})


def tagged_commit(spark: SparkSession, metadata: dict[str, Any]) -> AbstractContextManager[None]:
    """Run one Delta SQL command inside the block with `metadata` in its commit (no SetTransaction)."""
    return _command_settings(spark, {_USER_METADATA: json.dumps(metadata, sort_keys=True)})


@contextmanager
def _command_settings(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    with _lock:
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in settings:
                spark.conf.unset(key)


def begin_append(spark: SparkSession, path: str, prepare: Callable[[], None] | None = None) -> Future | None:
    """Run `prepare` if given (it makes sure the tables exist), then start the Delta transaction whose writer
    `append_once` will use on the table at `path`, both in the background; None over Spark Connect, where
    nothing runs (the caller prepares, and `append_once` reads the table's definition with delta-rs).

    Starting a transaction brings Spark's view of the table up to date, which after a commit by delta-rs is a
    Spark job of its own, and a first batch creates its tables: begun while the batch is read and validated, both
    overlap that work. The transaction only lends its writer the table's definition (schema, constraints,
    settings): the commit is delta-rs's, and `append_once` refuses it if the table was redefined since the
    transaction began.
    """
    session = getattr(spark, "_jsparkSession", None)
    if session is None:
        return None
    delta_log = spark._jvm.org.apache.spark.sql.delta.DeltaLog  # type: ignore[union-attr]

    def begin() -> Any:
        if prepare is not None:
            prepare()
        return delta_log.forTable(session, path).startTransaction()

    return _starter.submit(begin)


def append_once(
    df: DataFrame | pa.Table, path: str, app_id: str, version: int, metadata: dict[str, Any],
    begun: Future | None = None, read_version: int | None = None,
) -> bool:
    """Append `df` (a DataFrame, or rows this process holds as Arrow) to the Delta table at `path` as the
    transaction `(app_id, version)`; False (nothing written) when the table has committed that transaction already.
    `begun` is the table's `begin_append`, if started.

    `read_version`: the table version the rows were found new against. The commit is then made on that version
    and fails (`CommitFailedError`) if any writer, whatever its app id, committed since: a blind append rebased
    over a commit that added one of its IDs would hold that ID twice. The caller decides again and retries.

    On a classic session Delta's own writer writes the files (partitioned, with its statistics and constraint
    checks) without committing, and delta-rs commits them with the SetTransaction. Both read the table's
    transactions first, and a concurrent commit of the same `(app_id, version)` makes this one fail (delta-rs's
    conflict check, as Spark's): exactly as safe as Delta's `txnAppId` append, but without the Spark state
    reconstruction that append runs to read the transactions (paid on every commit, and growing with the table).
    Over Spark Connect, whose client cannot reach the writer of a transaction, the rows come to this process as
    Arrow, conformed to the table's schema at `read_version` (else its newest) by Spark, and delta-rs writes and
    commits them the same way (`onceflow.jobs.delta.arrow_append`): a Spark write would first commit to a table of
    its own, which cost a new process seconds and every later batch a fifth of a second more. A table with
    columns delta-rs cannot write (VARIANT) has Delta's writer write the files as a staging table inside the table,
    and delta-rs commits them (`onceflow.jobs.delta.staging.write_staged`). Rows held as Arrow (a batch whose rows
    came to the driver whole) are conformed here and written by delta-rs on either kind of session. (Delta's own
    `txnAppId` append is blind to `read_version`, and an insert-only MERGE that conflicts with every commit since
    cost about twice as much.)
    """
    if holds_batch(path, app_id, version):
        return False
    text = json.dumps(metadata, sort_keys=True)
    if hasattr(df, "_jdf"):
        written_for, adds = _write_files(df, path, begun)
    else:  # rows held here, or a Spark Connect DataFrame: its client cannot reach Delta's writer
        written_for = latest_version(path) if read_version is None else read_version
        written = writable_table(path, written_for)
        if arrow_writable(written):
            rows = (conform_arrow(df, _spark_schema(written), path) if isinstance(df, pa.Table)
                    else conform(df, _spark_schema(written), path).toArrow())
            return append_arrow_once(written, rows, app_id, version, metadata, rebase=read_version is None)
        if isinstance(df, pa.Table):
            raise TableSchemaError(f"{path}: the table has columns delta-rs cannot write (VARIANT), so its rows must "
                                   "come as a DataFrame; nothing written")
        adds = write_staged(df, written, _definition(written))
    table = _table(path, version=read_version)
    if holds_batch(path, app_id, version):
        return False  # committed meanwhile; the files just written stay unreferenced until VACUUM removes them
    latest = table_snapshot(path) if read_version is not None else table
    if latest.version() > written_for and _definition(table_snapshot(path, written_for)) != _definition(latest):
        # Written for a schema, constraints or protocol the table no longer has: Spark would refuse the commit too.
        raise CommitFailedError(f"{path}: the table was redefined after version {written_for}, which this append "
                                "was written for")
    rows = sum(json.loads(add.stats)["numRecords"] for add in adds)
    metrics = {"numFiles": str(len(adds)), "numOutputRows": str(rows),
               "numOutputBytes": str(sum(add.size for add in adds))}
    table.create_write_transaction(
        adds, "append", table.schema(), partition_by=table.metadata().partition_columns,
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": text, "operationMetrics": metrics},
            app_transactions=[Transaction(app_id, version)],
            # On the version the rows were found new against, any commit since is a conflict, never a rebase.
            max_commit_retries=0 if read_version is not None else None,
        ),
        post_commithook_properties=post_commit_hooks(table),
    )
    if read_version is not None:  # committed as the very next version, which `table` does not move to
        made_commit(path, read_version + 1, table.metadata().id, app_id, version)
    return True


def warm_writer(spark: SparkSession, path: str) -> None:
    """Have Delta's writer write no rows to the table at `path` as `append_once` would, committing nothing: a new
    process's first append is then seconds faster (its staging table made, Delta's writer and the table's log loaded
    in its session). Nothing to do where the table does not exist yet, or where delta-rs writes its appends (every
    table without VARIANT: `onceflow.jobs.ingest.batch_read.rows_to_driver`)."""
    try:
        table = _table(path)
    except TableNotFoundError:
        return
    if arrow_writable(table):
        return
    empty = spark.createDataFrame([], _spark_schema(table))
    if hasattr(empty, "_jdf"):
        _write_files(empty, path, None)
    else:
        write_staged(empty, table, _definition(table))


def _write_files(df: DataFrame, path: str, begun: Future | None) -> tuple[int, list[AddAction]]:
    """Write `df` as data files of the table at `path` with Delta's writer, uncommitted: the table version they
    were written for, and their add actions."""
    if begun is None:
        begun = begin_append(df.sparkSession, path)
    transaction = begun.result()  # type: ignore[union-attr]
    # Delta's writer writes whatever schema it is given: only rows with the table's own schema become its files.
    df = conform(df, T.StructType.fromJson(json.loads(transaction.metadata().schema().json())), path)
    actions = transaction.writeFiles(df._jdf)
    adds = []
    for i in range(actions.size()):
        add = json.loads(actions.apply(i).json())["add"]
        adds.append(AddAction(add["path"], add["size"], add["partitionValues"], add["modificationTime"],
                              add["dataChange"], add["stats"]))
    return transaction.snapshot().version(), adds


def _spark_schema(table: DeltaTable) -> T.StructType:
    return T.StructType.fromJson(json.loads(table.schema().to_json()))


def _table(path: str, version: int | None = None) -> DeltaTable:
    """delta-rs's table at `path` (through this module's name for `DeltaTable`, which tests replace)."""
    return DeltaTable(path, version=version, storage_options=storage_options(path))


def _definition(table: DeltaTable) -> tuple:
    """What files written for a table depend on: its schema, partitioning, settings (constraints among them)
    and protocol."""
    metadata, protocol = table.metadata(), table.protocol()
    return (table.schema().to_json(), metadata.partition_columns, metadata.configuration, protocol.min_reader_version,
            protocol.min_writer_version, protocol.reader_features, protocol.writer_features)


def latest_version(path: str) -> int:
    """The table's newest version (read from its log with delta-rs: no Spark job)."""
    return newest_version(path)


LOG_MARGIN_H = 24
"""How much longer than its files a table keeps its log: a version is read from the checkpoint before it, which
log cleanup keeps only while it is within the log's retention."""


def table_properties(retention_s: int, stats_columns: tuple[str, ...] = ()) -> dict[str, str]:
    """The properties of every onceflow table: old versions kept for at least `retention_s` (whole hours, rounded
    up; the log `LOG_MARGIN_H` longer, so that time travel to any version inside the retention finds the
    checkpoint it starts from), a checkpoint every 10 commits whichever engine commits (Spark's default; delta-rs,
    which commits appends, would take 100), and with `stats_columns` file statistics for those columns only."""
    hours = max(1, -(-retention_s // 3600))
    stats = {"delta.dataSkippingStatsColumns": ",".join(stats_columns)} if stats_columns else {}
    return {
        "delta.logRetentionDuration": f"interval {hours + LOG_MARGIN_H} hours",
        "delta.deletedFileRetentionDuration": f"interval {hours} hours",
        "delta.checkpointInterval": "10",
        **stats,
    }
