"""Appends on a classic Spark session (Delta's writer writes, delta-rs commits), raced on purpose.

Run as `python -m tests.classic_appends <table path>` by `tests/test_classic_appends.py`: the test suite's own
session is a Spark Connect client, which takes the other append path, so this one needs a process of its own.
Prints what it saw as JSON; the test checks it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import onceflow.jobs.delta.transactions as delta_txn
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.delta.commit_log import committed_metrics
from onceflow.jobs.delta.transactions import (
    append_once,
    begin_append,
    create_table_once,
    is_concurrent_commit,
    table_properties,
)
from onceflow.resources.spark import build_spark_session


def rows(spark: SparkSession, start: int, end: int) -> DataFrame:
    return spark.range(start, end).select(
        F.format_string("r%04d", "id").alias("record_id"), (F.col("id") % 3).alias("bucket")
    )


class RacedTable(DeltaTable):
    """A table whose first commit lets another writer commit first, after this one read the table."""

    winner: tuple[DataFrame, str, str, int] | None = None

    def create_write_transaction(self, *args: Any, **kwargs: Any) -> None:
        if RacedTable.winner is not None:
            df, path, app_id, version = RacedTable.winner
            RacedTable.winner = None
            append_once(df, path, app_id, version, {"winner": True})
        super().create_write_transaction(*args, **kwargs)


def race(spark: SparkSession, path: str, winner: tuple[DataFrame, str, int], loser: tuple[DataFrame, str, int]) -> str:
    """Run the loser's append with the winner committing between the loser's read and its commit."""
    RacedTable.winner = (winner[0], path, winner[1], winner[2])
    delta_txn.DeltaTable = RacedTable  # type: ignore[misc]
    try:
        committed = append_once(loser[0], path, loser[1], loser[2], {"loser": True})
        return "committed" if committed else "skipped"
    except Exception as error:
        return "conflict" if is_concurrent_commit(error) else f"error: {error}"
    finally:
        delta_txn.DeltaTable = DeltaTable  # type: ignore[misc]


def main(path: str) -> dict[str, Any]:
    spark = build_spark_session()
    create_table_once(path, parse_schema("record_id STRING NOT NULL, bucket BIGINT"), table_properties(3600),
                      partitioned_by=("bucket",))
    seen: dict[str, Any] = {
        "first": append_once(rows(spark, 0, 100), path, "a", 1, {"onceflow_source": "a", "onceflow_batch": 1}),
        "replay": append_once(rows(spark, 0, 100), path, "a", 1, {"onceflow_source": "a", "onceflow_batch": 1}),
        # The same batch raced: the winner's rows are in, the loser's are not.
        "same_batch": race(spark, path, (rows(spark, 100, 150), "a", 2), (rows(spark, 200, 250), "a", 2)),
        # Another source's commit in between does not conflict: both are in.
        "other_source": race(spark, path, (rows(spark, 300, 310), "b", 1), (rows(spark, 400, 410), "a", 3)),
    }
    # A transaction begun, then the table redefined before the append commits: refused, and a fresh attempt is
    # held to the new definition.
    begun = begin_append(spark, path)
    assert begun is not None
    begun.result()
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT before_500 CHECK (record_id < 'r0500')")
    late = {"onceflow_source": "c", "onceflow_batch": 1}
    try:
        seen["redefined"] = str(append_once(rows(spark, 500, 510), path, "c", 1, late, begun))
    except Exception as error:
        seen["redefined"] = "conflict" if is_concurrent_commit(error) else f"error: {error}"
    try:
        seen["redefined_retry"] = str(append_once(rows(spark, 500, 510), path, "c", 1, late))
    except Exception as error:
        seen["redefined_retry"] = "violation" if "DELTA_VIOLATE_CONSTRAINT" in str(error) else f"error: {error}"
    ids = DeltaTable(path).to_pyarrow_table(columns=["record_id"]).column("record_id").to_pylist()
    seen["ids"] = sorted(ids)
    seen["spark_count"] = spark.read.format("delta").load(path).count()
    seen["versions"] = {app: DeltaTable(path).transaction_version(app) for app in ("a", "b")}
    seen["metrics_of_batch_1"] = committed_metrics(spark, path, {"onceflow_source": "a", "onceflow_batch": 1})
    return seen


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
