"""What a table's Delta log says about onceflow's commits: the batch a source's app id has reached, what a batch's
commit carried and which attempt made it (read with delta-rs, no Spark session needed, the same on every replay),
and the figures of the commit that did a batch's work."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from typing import Any

from deltalake.exceptions import TableNotFoundError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from onceflow.resources.delta_storage import commit_actions, table_snapshot, transaction_version

ATTEMPT_KEY = "onceflow_attempt"
"""Commit metadata naming the attempt that wrote the commit: which of two concurrent attempts at one batch won."""


class LakeAheadError(RuntimeError):
    """A commit of batch `batch` of `app_id` found the table holding a later batch of that app id: its batch
    numbering is behind the lake's (the run must realign first), so it must neither write nor count as a replay."""

    def __init__(self, path: str, app_id: str, batch: int, lake_batch: int) -> None:
        super().__init__(f"{path}: {app_id} is committing batch {batch}, but the table holds batch {lake_batch} "
                         "of it already; a run realigned with the lake numbers its batches after that")
        self.path, self.app_id, self.batch, self.lake_batch = path, app_id, batch, lake_batch


def committed_batch(path: str, app_id: str) -> int | None:
    """The SetTransaction version the table at `path` holds for `app_id` (read from its log), None if none.

    Read with delta-rs straight from the log: no Spark session needed, and the same on every replay.
    """
    try:
        return transaction_version(path, app_id)
    except TableNotFoundError:
        return None


def holds_batch(path: str, app_id: str, batch: int) -> bool:
    """Whether the table at `path` holds batch `batch` of `app_id` already (a replay); `LakeAheadError` when it
    holds a later one."""
    held = committed_batch(path, app_id) or 0
    if held > batch:
        raise LakeAheadError(path, app_id, batch, held)
    return held == batch


def _commits_of(
    path: str, app_id: str, batches: Collection[int], lookback: int | None = None
) -> Iterator[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(batch, its commit's metadata, the commit) for each of `batches` that `app_id` committed among the table's
    newest `lookback` commits (all when None), read from its log with delta-rs in one pass."""
    wanted = set(batches)
    try:
        history = table_snapshot(path).history(lookback) if wanted else []
    except TableNotFoundError:
        return
    for commit in history:
        try:
            metadata = json.loads(commit.get("userMetadata") or "{}")
        except json.JSONDecodeError:
            continue  # a commit made by someone else, with metadata of their own
        batch = metadata.get("onceflow_batch") if isinstance(metadata, dict) else None
        if metadata.get("onceflow_source") == app_id and batch in wanted:
            yield batch, metadata, commit
            wanted.discard(batch)
            if not wanted:
                return


def committed_metadata(
    path: str, app_id: str, versions: Collection[int], lookback: int | None = None
) -> dict[int, dict[str, Any]]:
    """The metadata the commits of `(app_id, v)` for v in `versions` carried (see `delta_transaction`), by version,
    read from the table's log (its newest `lookback` commits, all when None); a version the table holds no commit
    of (yet, or any more) is absent."""
    return {batch: metadata for batch, metadata, _ in _commits_of(path, app_id, versions, lookback)}


def batch_versions(path: str, app_id: str, batches: Collection[int], lookback: int = 1000) -> dict[int, int]:
    """The table version of the commit of `(app_id, b)` for b in `batches`, by batch, from its newest `lookback`
    commits; a batch not among them is absent."""
    return {batch: int(commit["version"]) for batch, _, commit in _commits_of(path, app_id, batches, lookback)}


def committed_rows(path: str, app_id: str, batches: Collection[int]) -> dict[int, int]:
    """The rows the commits of `(app_id, b)` for b in `batches` inserted into the table at `path`, by batch, from
    their operation metrics in the log; a batch the table holds no commit of is absent."""
    found = {}
    for batch, _, commit in _commits_of(path, app_id, batches):
        metrics = commit.get("operationMetrics") or {}
        found[batch] = (int(metrics["numTargetRowsInserted"]) if "numTargetRowsInserted" in metrics
                        else rows_appended(metrics))
    return found


def own_commit_version(path: str, metadata: dict[str, Any], after: int) -> int:
    """The version of the commit that carried `metadata` when it is the one right after version `after`, else
    `after`: the newest version up to which this writer knows every commit."""
    return after + 1 if committed_next(path, after, ("onceflow_source", "onceflow_batch"), metadata) else after


def committed_next(path: str, after: int, keys: tuple[str, ...], metadata: dict[str, Any]) -> bool:
    """Whether the table's commit `after + 1` carried `metadata`'s values of `keys`: then no other writer committed
    between version `after` and it. Read from that commit's own file in the log (one read, where loading the table
    read its log since the last checkpoint); a file that cannot be read says no, which costs only work redone."""
    try:
        actions = commit_actions(path, after + 1)
    except OSError:  # not committed (yet), or unreadable now
        return False
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    try:
        carried = json.loads(info.get("userMetadata") or "{}")
    except json.JSONDecodeError:
        return False  # a commit made by someone else, with metadata of their own
    return isinstance(carried, dict) and all(carried.get(key) == metadata[key] for key in keys)


def committed_metrics(spark: SparkSession, path: str, metadata: dict[str, Any], lookback: int = 1000) -> dict[str, str]:
    """The operation metrics of the commit that carried `metadata` (an earlier attempt of the same batch).

    A replayed batch writes nothing; its counts are those of the commit that did the work, so totals stay exact
    however many attempts a batch took.
    """
    source, batch = metadata["onceflow_source"], metadata["onceflow_batch"]
    rows = (
        spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT {lookback}")
        .filter((F.get_json_object("userMetadata", "$.onceflow_source") == F.lit(source))
                & (F.get_json_object("userMetadata", "$.onceflow_batch") == F.lit(str(batch))))
        .select("operationMetrics")
        .collect()
    )
    if not rows:
        raise RuntimeError(f"{path}: Delta skipped batch {batch} of {source} as committed, but no commit of it is in "
                           "the table's history")
    return dict(rows[0]["operationMetrics"])


def rows_appended(metrics: dict[str, str]) -> int:
    """The rows an append's commit added, by Spark's name for them or delta-rs's (whose `write_deltalake` commits
    with its own metrics: `onceflow.jobs.delta.arrow_append`)."""
    return int(metrics.get("numOutputRows", metrics.get("num_added_rows", 0)))
