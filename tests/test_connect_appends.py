"""An append over Spark Connect: Delta's writer writes the files as a staging table inside the table, delta-rs
commits them with the SetTransaction (`onceflow.jobs.delta.transactions._write_staged`). Read back with delta-rs;
each file's statistics are checked against the rows it really holds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from onceflow.jobs.delta.staging import remove_abandoned_staging
from onceflow.jobs.delta.transactions import append_once, create_table_once, table_properties
from onceflow.orchestration.cli.main import PROJECT_ROOT
from onceflow.resources.faults import CRASH_EXIT_CODE
from onceflow.resources.spark_connect import SparkConnectServer

SCHEMA = T.StructType([
    T.StructField("record_id", T.StringType(), False),
    T.StructField("event_time", T.TimestampType()),
    T.StructField("amount", T.DecimalType(12, 2)),
    T.StructField("note", T.StringType()),
    T.StructField("batch_id", T.LongType()),
    T.StructField("time_bucket", T.LongType()),
])
STATS_PREFIX = 32  # characters of a string statistic Delta's writer keeps
LONG = "x" * STATS_PREFIX  # a record ID longer than that


def rows(batch: int, count: int) -> list[tuple]:
    """`count` rows of `batch` over two time buckets; IDs long enough to be cut, one with 😀 past the cut."""
    return [(f"{LONG}{batch:02d}-{n:03d}{'😀' if n == 1 else ''}",
             datetime(2026, 11, 26, 10, 0, n % 60, 123_456 + n, tzinfo=UTC),
             None, None if n % 3 else f"note {n}", batch, n % 2) for n in range(count)]


@pytest.fixture
def table(tmp_path: Path) -> str:
    path = str(tmp_path / "raw")
    create_table_once(path, SCHEMA, table_properties(86_400, ("record_id", "event_time", "batch_id")),
                      partitioned_by=("time_bucket",))
    return path


def test_a_connect_append_commits_spark_written_files_with_deltas_statistics(spark: SparkSession, table: str) -> None:
    if hasattr(spark, "_jsparkSession"):
        pytest.skip("a classic session appends with Delta's own writer (tests/test_classic_appends.py)")
    written = rows(1, 40)
    assert append_once(spark.createDataFrame(written, SCHEMA), table, "p/raw", 1, {"batch": 1}, read_version=0)
    delta = DeltaTable(table)
    assert delta.version() == 1
    assert sorted(delta.to_pyarrow_table().to_pylist(), key=lambda r: r["record_id"]) == sorted(
        (dict(zip(SCHEMA.names, r, strict=True)) for r in written), key=lambda r: r["record_id"])
    assert delta.transaction_version("p/raw") == 1
    adds = pa.table(delta.get_add_actions(flatten=True)).to_pylist()
    assert {a["partition.time_bucket"] for a in adds} == {0, 1}  # a file per task and bucket, as Delta's writer
    assert sum(a["num_records"] for a in adds if a["partition.time_bucket"] == 1) == 20
    for add in adds:
        assert add["path"].startswith("onceflow-") and f"/time_bucket={add['partition.time_bucket']}/" in add["path"]
        held = pq.read_table(Path(table) / add["path"], coerce_int96_timestamp_unit="us").to_pylist()
        ids, times = [r["record_id"] for r in held], [r["event_time"].replace(tzinfo=UTC) for r in held]
        assert add["num_records"] == len(held) > 0
        assert add["min.record_id"] == min(ids)[:STATS_PREFIX] == LONG
        # Cut as Delta cuts a long maximum (its first 32 characters, then a tie-breaker): still a bound.
        assert add["max.record_id"].startswith(LONG) and len(add["max.record_id"]) == 33 and add[
            "max.record_id"] >= max(ids)
        # Delta keeps times to the millisecond (its readers allow for the cut maximum).
        assert add["min.event_time"] <= min(times) and timedelta(0) <= max(times) - add["max.event_time"] < timedelta(
            milliseconds=1)
        assert add["min.batch_id"] == add["max.batch_id"] == 1 and add["null_count.batch_id"] == 0
        assert "min.amount" not in add or add["min.amount"] is None  # not a statistics column
    # A replay writes nothing; an append decided against an older version fails rather than rebases.
    assert not append_once(spark.createDataFrame(written, SCHEMA), table, "p/raw", 1, {"batch": 1}, read_version=0)
    with pytest.raises(CommitFailedError):
        append_once(spark.createDataFrame(rows(2, 4), SCHEMA), table, "p/raw", 2, {"batch": 2}, read_version=0)
    assert append_once(spark.createDataFrame(rows(2, 4), SCHEMA), table, "p/raw", 2, {"batch": 2}, read_version=1)
    assert DeltaTable(table).to_pyarrow_table().num_rows == 44
    # This process wrote every append into one staging table (its log is removed when the process exits).
    staged = {a["path"].split("/", 1)[0] for a in pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pylist()}
    assert [p.parent.name for p in Path(table).glob("onceflow-*/_delta_log")] == list(staged) and len(staged) == 1
    # Spark reads the table delta-rs committed, its statistics included.
    assert spark.read.format("delta").load(table).where(f"record_id < '{LONG}01-005'").count() == 5


KILLED_APPEND = """
import sys
from onceflow.jobs.delta.transactions import append_once
from onceflow.resources.spark import build_spark_session
from tests.test_connect_appends import SCHEMA, rows
spark = build_spark_session(remote=sys.argv[2])
append_once(spark.createDataFrame(rows(1, 10), SCHEMA), sys.argv[1], "p/raw", 1, {"batch": 1}, read_version=0)
"""


def test_maintenance_removes_the_staging_log_of_an_append_killed_mid_write(
    spark: SparkSession, spark_connect: SparkConnectServer, table: str
) -> None:
    if hasattr(spark, "_jsparkSession"):
        pytest.skip("a classic session writes no staging table")
    # A process of its own, connecting as any other: pyspark's marks of this process's session stay behind.
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    killed = subprocess.run([sys.executable, "-c", KILLED_APPEND, table, spark_connect.url], cwd=PROJECT_ROOT, capture_output=True,
                            text=True, timeout=300, env={**env, "ONCEFLOW_CRASH_AT": "ingest.append_staged"})
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr[-3000:]
    (left,) = Path(table).glob("onceflow-*/_delta_log")  # the attempt died before removing its staging log
    assert append_once(spark.createDataFrame(rows(1, 10), SCHEMA), table, "p/raw", 1, {"batch": 1}, read_version=0)
    # A process that exits removes its own staging log; the files it committed stay.
    appended = subprocess.run([sys.executable, "-c", KILLED_APPEND.replace('"p/raw", 1, {"batch": 1}, read_version=0',
                               '"p/other", 1, {"batch": 1}, read_version=1'), table, spark_connect.url],
                              cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert appended.returncode == 0, appended.stderr[-3000:]
    (exited,) = {a["path"].split("/", 1)[0] for a in pa.table(DeltaTable(table, version=2).get_add_actions(
        flatten=True)).to_pylist()} - {p.parent.name for p in Path(table).glob("onceflow-*/_delta_log")}
    assert list((Path(table) / exited).glob("time_bucket=*/*.parquet"))
    (ours,) = {p for p in Path(table).glob("onceflow-*/_delta_log")} - {left}  # this process's, still written
    emptied = Path(table) / "onceflow-emptied" / "time_bucket=0"  # what VACUUM leaves of a compacted batch's files
    emptied.mkdir(parents=True)

    assert remove_abandoned_staging(table, older_than_s=3_600) == 0  # either may be a process still writing
    assert left.exists() and ours.exists() and emptied.exists()
    # An hour on, no process writes them any more (one is not written again after 10 idle minutes).
    assert remove_abandoned_staging(table, older_than_s=3_600, now_s=time.time() + 3_601) == 2
    assert not list(Path(table).glob("onceflow-*/_delta_log")) and not emptied.parent.exists()
    assert list(left.parent.glob("time_bucket=*/*.parquet"))  # its data files are VACUUM's to remove
    delta = DeltaTable(table)
    assert delta.version() == 2 and sorted(r["record_id"] for r in delta.to_pyarrow_table().to_pylist()) == sorted(
        r[0] for r in rows(1, 10) * 2)
