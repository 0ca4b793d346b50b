"""An append over Spark Connect: Spark's Parquet writer writes the files, delta-rs commits them with the
SetTransaction and the statistics Delta's writer would keep (`onceflow.jobs.delta.parquet_files`). Read back with
delta-rs; the statistics are checked against the rows each file really holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from onceflow.jobs.delta.parquet_files import STATS_PREFIX, footer_stats, partition_values
from onceflow.jobs.delta.transactions import append_once, create_table_once, table_properties

SCHEMA = T.StructType([
    T.StructField("record_id", T.StringType(), False),
    T.StructField("event_time", T.TimestampType()),
    T.StructField("amount", T.DecimalType(12, 2)),
    T.StructField("note", T.StringType()),
    T.StructField("batch_id", T.LongType()),
    T.StructField("time_bucket", T.LongType()),
])
LONG = "x" * STATS_PREFIX  # a record ID longer than Delta keeps of a statistic


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
        held = pq.read_table(Path(table) / add["path"]).to_pylist()
        ids, times = [r["record_id"] for r in held], [r["event_time"] for r in held]
        assert add["num_records"] == len(held) > 0
        assert add["min.record_id"] == min(ids)[:STATS_PREFIX] == LONG
        assert add["max.record_id"] == LONG + "\U0010ffff" >= max(ids)  # cut as Delta cuts it: still a bound
        assert add["min.event_time"] <= min(times) and add["max.event_time"] >= max(times)
        assert add["max.event_time"] - max(times) < timedelta(milliseconds=1)
        assert add["min.batch_id"] == add["max.batch_id"] == 1 and add["null_count.batch_id"] == 0
        assert "min.amount" not in add or add["min.amount"] is None  # not a statistics column
    assert not list(Path(table).glob("onceflow-*/_SUCCESS"))
    # A replay writes nothing; an append decided against an older version fails rather than rebases.
    assert not append_once(spark.createDataFrame(written, SCHEMA), table, "p/raw", 1, {"batch": 1}, read_version=0)
    with pytest.raises(CommitFailedError):
        append_once(spark.createDataFrame(rows(2, 4), SCHEMA), table, "p/raw", 2, {"batch": 2}, read_version=0)
    assert append_once(spark.createDataFrame(rows(2, 4), SCHEMA), table, "p/raw", 2, {"batch": 2}, read_version=1)
    assert DeltaTable(table).to_pyarrow_table().num_rows == 44
    # Spark reads the table delta-rs committed, its statistics included.
    assert spark.read.format("delta").load(table).where(f"record_id < '{LONG}01-005'").count() == 5


def test_footer_statistics_are_bounds_in_deltas_form(tmp_path: Path) -> None:
    file = tmp_path / "part.parquet"
    times = [datetime(2026, 1, 1, 0, 0, 0, 999, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 1, 1, tzinfo=UTC)]
    pq.write_table(pa.table({
        "record_id": ["b" * 40 + "😀", "a"], "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
        "n": pa.array([None, 7], pa.int64()), "price": pa.array([1.5, 2.5]),
    }), file, row_group_size=1)
    stats = footer_stats(pq.read_metadata(file), {"record_id", "event_time", "n", "price"})
    assert stats["numRecords"] == 2
    assert stats["minValues"] == {"record_id": "a", "event_time": "2026-01-01T00:00:00.000Z", "n": 7}
    assert stats["maxValues"] == {"record_id": "b" * 32 + "\U0010ffff", "event_time": "2026-01-01T00:00:01.001Z",
                                  "n": 7}
    assert stats["nullCount"] == {"record_id": 0, "event_time": 0, "n": 1, "price": 0}
    assert json.loads(json.dumps(stats)) == stats
    assert partition_values("t/onceflow-1/day=2026-01-01/city=S%C3%A3o%20Paulo/part-0.parquet",
                            ["city", "day", "hour"]) == {"city": "São Paulo", "day": "2026-01-01", "hour": None}
    assert partition_values("t/onceflow-1/day=__HIVE_DEFAULT_PARTITION__/part-0.parquet", ["day"]) == {"day": None}
