"""An append over Spark Connect: the rows come to the client as Arrow and delta-rs writes and commits them with the
SetTransaction; for a table with a VARIANT column (delta-rs cannot write one), Delta's writer writes the files as a
staging table inside the table and delta-rs commits them (`onceflow.jobs.delta.staging.write_staged`). Read back
with delta-rs; each file's statistics are checked against the rows it really holds."""

from __future__ import annotations

import os
import re
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
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from onceflow.jobs.delta.schema_evolution import TableSchemaError
from onceflow.jobs.delta.staging import remove_abandoned_staging
from onceflow.jobs.delta.transactions import append_once, create_table_once, table_properties
from onceflow.orchestration.checkout import PROJECT_ROOT
from onceflow.resources.faults import CRASH_EXIT_CODE
from onceflow.resources.spark_connect import SparkConnectServer

PLAIN = T.StructType([
    T.StructField("record_id", T.StringType(), False),
    T.StructField("event_time", T.TimestampType()),
    T.StructField("amount", T.DecimalType(12, 2)),
    T.StructField("note", T.StringType()),
    T.StructField("batch_id", T.LongType()),
    T.StructField("time_bucket", T.LongType()),
])
SCHEMA = T.StructType([*PLAIN.fields, T.StructField("doc", T.VariantType())])  # staged: delta-rs writes no VARIANT
STATS_PREFIX = 32  # characters of a string statistic Delta's writer keeps
LONG = "x" * STATS_PREFIX  # a record ID longer than that


def rows(batch: int, count: int) -> list[tuple]:
    """`count` rows of `batch` over two time buckets; IDs long enough to be cut, one with 😀 past the cut."""
    return [(f"{LONG}{batch:02d}-{n:03d}{'😀' if n == 1 else ''}",
             datetime(2026, 11, 26, 10, 0, n % 60, 123_456 + n, tzinfo=UTC),
             None, None if n % 3 else f"note {n}", batch, n % 2) for n in range(count)]


def make_table(path: Path, schema: T.StructType) -> str:
    create_table_once(str(path), schema, table_properties(86_400, ("record_id", "event_time", "batch_id")),
                      partitioned_by=("time_bucket",))
    return str(path)


@pytest.fixture
def table(tmp_path: Path) -> str:
    return make_table(tmp_path / "raw", SCHEMA)


def frame(spark: SparkSession, written: list[tuple]) -> DataFrame:
    """`written` (rows of `PLAIN`) with an object in the VARIANT column."""
    return spark.createDataFrame(written, PLAIN).selectExpr("*", "parse_json('{\"a\": 1}') AS doc")


def test_rows_held_as_arrow_append_only_with_exactly_the_tables_columns_and_types(
    spark: SparkSession, tmp_path: Path, table: str
) -> None:
    """A batch whose rows came to the driver whole (`rows_to_driver`) appends them as Arrow, on either engine path:
    only with the table's own columns and types, as Spark's types read back from Arrow's; never to a VARIANT
    table, which delta-rs cannot write."""
    plain = make_table(tmp_path / "plain", PLAIN)
    held = spark.createDataFrame(rows(1, 6), PLAIN).toArrow()
    retyped = held.set_column(2, "amount", held["amount"].cast(pa.decimal128(14, 2)))
    for wrong, named in ((retyped, "amount (decimal(14,2) in the rows, decimal(12,2) in the table)"),
                         (held.drop_columns(["note"]), "note (absent in the rows, string in the table)"),
                         (held.append_column("extra", pa.array([1] * 6)), "extra (bigint in the rows, absent")):
        with pytest.raises(TableSchemaError, match=re.escape(named)):
            append_once(wrong, plain, "p/raw", 1, {"batch": 1}, read_version=0)
    with pytest.raises(TableSchemaError, match="VARIANT"):
        append_once(held, table, "p/raw", 1, {"batch": 1})
    assert DeltaTable(plain).version() == 0 and DeltaTable(table).to_pyarrow_table().num_rows == 0
    # Columns in another order are the table's columns: they land in the table's order.
    assert append_once(held.select(PLAIN.names[::-1]), plain, "p/raw", 1, {"batch": 1}, read_version=0)
    assert not append_once(held, plain, "p/raw", 1, {"batch": 1}, read_version=0)  # a replay
    delta = DeltaTable(plain)
    assert (delta.version(), delta.transaction_version("p/raw")) == (1, 1)
    assert sorted(delta.to_pyarrow_table().to_pylist(), key=lambda r: r["record_id"]) == sorted(
        (dict(zip(PLAIN.names, r, strict=True)) for r in rows(1, 6)), key=lambda r: r["record_id"])


def test_a_connect_append_has_delta_rs_write_and_commit_the_rows(spark: SparkSession, tmp_path: Path) -> None:
    if hasattr(spark, "_jsparkSession"):
        pytest.skip("a classic session appends with Delta's own writer (tests/test_classic_appends.py)")
    table = make_table(tmp_path / "plain", PLAIN)
    written = rows(1, 40)
    assert append_once(spark.createDataFrame(written, PLAIN), table, "p/raw", 1, {"batch": 1}, read_version=0)
    delta = DeltaTable(table)
    assert (delta.version(), delta.transaction_version("p/raw")) == (1, 1)
    assert sorted(delta.to_pyarrow_table().to_pylist(), key=lambda r: r["record_id"]) == sorted(
        (dict(zip(PLAIN.names, r, strict=True)) for r in written), key=lambda r: r["record_id"])
    adds = pa.table(delta.get_add_actions(flatten=True)).to_pylist()
    assert sum(a["num_records"] for a in adds) == 40 and {a["partition.time_bucket"] for a in adds} == {0, 1}
    for add in adds:
        assert add["path"].startswith(f"time_bucket={add['partition.time_bucket']}/")  # no staging table
        held = pq.read_table(Path(table) / add["path"]).to_pylist()
        ids, times = [r["record_id"] for r in held], [r["event_time"] for r in held]
        assert add["num_records"] == len(held) > 0
        assert add["min.record_id"] <= min(ids) and add["max.record_id"] >= max(ids)
        # Kept to the millisecond, as Delta keeps them (its readers allow for the cut maximum).
        assert add["min.event_time"] <= min(times) and timedelta(0) <= max(times) - add["max.event_time"] < timedelta(
            milliseconds=1)
        assert add["min.batch_id"] == add["max.batch_id"] == 1
        assert "min.amount" not in add or add["min.amount"] is None  # not a statistics column
    assert not list(Path(table).glob("onceflow-*"))
    # A replay writes nothing; an append decided against an older version fails rather than rebases; one decided
    # against no version (at-least-once) is rebased over the commits since.
    assert not append_once(spark.createDataFrame(written, PLAIN), table, "p/raw", 1, {"batch": 1}, read_version=0)
    with pytest.raises(CommitFailedError):
        append_once(spark.createDataFrame(rows(2, 4), PLAIN), table, "p/raw", 2, {"batch": 2}, read_version=0)
    assert append_once(spark.createDataFrame(rows(2, 4), PLAIN), table, "p/raw", 2, {"batch": 2})
    assert append_once(spark.createDataFrame([], PLAIN), table, "p/raw", 3, {"batch": 3}, read_version=2)
    delta = DeltaTable(table)
    assert (delta.version(), delta.transaction_version("p/raw"), delta.to_pyarrow_table().num_rows) == (3, 3, 44)
    assert spark.read.format("delta").load(table).where(f"record_id < '{LONG}01-005'").count() == 5


def test_a_connect_append_of_a_variant_commits_spark_written_files_with_deltas_statistics(
    spark: SparkSession, table: str
) -> None:
    if hasattr(spark, "_jsparkSession"):
        pytest.skip("a classic session appends with Delta's own writer (tests/test_classic_appends.py)")
    written = rows(1, 40)
    base = DeltaTable(table).version()  # a table with table features and a NOT NULL column lists `invariants` too
    assert append_once(frame(spark, written), table, "p/raw", 1, {"batch": 1}, read_version=base)
    delta = DeltaTable(table)
    assert delta.version() == base + 1
    assert sorted(spark.read.format("delta").load(table).drop("doc").collect()) == sorted(
        spark.createDataFrame(written, PLAIN).collect())
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
    assert not append_once(frame(spark, written), table, "p/raw", 1, {"batch": 1}, read_version=base)
    with pytest.raises(CommitFailedError):
        append_once(frame(spark, rows(2, 4)), table, "p/raw", 2, {"batch": 2}, read_version=base)
    assert append_once(frame(spark, rows(2, 4)), table, "p/raw", 2, {"batch": 2}, read_version=base + 1)
    assert spark.read.format("delta").load(table).count() == 44
    # This process wrote every append into one staging table (its log is removed when the process exits).
    staged = {a["path"].split("/", 1)[0] for a in pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pylist()}
    assert [p.parent.name for p in Path(table).glob("onceflow-*/_delta_log")] == list(staged) and len(staged) == 1
    # Spark reads the table delta-rs committed, its statistics included.
    assert spark.read.format("delta").load(table).where(f"record_id < '{LONG}01-005'").count() == 5


KILLED_APPEND = """
import sys
from onceflow.jobs.delta.transactions import append_once
from onceflow.resources.spark import build_spark_session
from tests.test_connect_appends import frame, rows
spark = build_spark_session(remote=sys.argv[2])
append_once(frame(spark, rows(1, 10)), sys.argv[1], sys.argv[3], 1, {"batch": 1}, read_version=int(sys.argv[4]))
"""


def test_maintenance_removes_the_staging_log_of_an_append_killed_mid_write(
    spark: SparkSession, spark_connect: SparkConnectServer, table: str
) -> None:
    if hasattr(spark, "_jsparkSession"):
        pytest.skip("a classic session writes no staging table")
    # A process of its own, connecting as any other: pyspark's marks of this process's session stay behind.
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    base = DeltaTable(table).version()
    killed = subprocess.run([sys.executable, "-c", KILLED_APPEND, table, spark_connect.url, "p/raw", str(base)],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                            env={**env, "ONCEFLOW_CRASH_AT": "ingest.append_staged"})
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr[-3000:]
    (left,) = Path(table).glob("onceflow-*/_delta_log")  # the attempt died before removing its staging log
    assert append_once(frame(spark, rows(1, 10)), table, "p/raw", 1, {"batch": 1}, read_version=base)
    # A process that exits removes its own staging log; the files it committed stay.
    appended = subprocess.run([sys.executable, "-c", KILLED_APPEND, table, spark_connect.url, "p/other", str(base + 1)],
                              cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert appended.returncode == 0, appended.stderr[-3000:]
    (exited,) = {a["path"].split("/", 1)[0] for a in pa.table(DeltaTable(table, version=base + 2).get_add_actions(
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
    assert DeltaTable(table).version() == base + 2
    assert sorted(r[0] for r in spark.read.format("delta").load(table).select("record_id").collect()) == sorted(
        r[0] for r in rows(1, 10) * 2)
