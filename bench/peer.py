"""The peer a Spark user would pick instead of onceflow, and the floor (docs/design.md section 10, benchmarks 3 and 5).

Written as a competent Spark user writes them, on onceflow's benchmark session and settings, over the same
JSON-lines files (a data set of `bench.datasets`), with the same schema: the data set's record schema, its ID
and its event time (`Dataset.reader_schema`), converted by Spark's JSON reader as onceflow converts them:

- `streaming_dedup`: Structured Streaming file source (`maxFilesPerTrigger`), a generous event-time watermark,
  `dropDuplicatesWithinWatermark` on the ID, a `foreachBatch` Delta append made idempotent by the writer
  options `txnAppId` / `txnVersion` (= batch id); `trigger(availableNow=True)`.
- `streaming_merge`: the same stream without the stateful dedup; `foreachBatch` drops duplicates inside the batch
  and runs an insert-only MERGE on the ID, made idempotent by the session settings
  `spark.databricks.delta.write.txnAppId` / `txnVersion` (Delta's way for MERGE).
- `floor`: `spark.read.json` then a Delta append. No dedup at all.

Like any Spark JSON read, a malformed line becomes a row with NULLs where its values did not convert.

Timed: for the streams, `start()` until `awaitTermination()` returns (every micro-batch and its commit; not the
query's definition, not creating the MERGE target); for the floor, its one read-and-write action. Counting the
output (with delta-rs, a second engine) and the replay check are not timed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable as RsDeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from bench.datasets import BenchmarkError, Source
from bench.memory import PeakRss

CONTENDERS = ("streaming_dedup", "streaming_merge", "floor")
WATERMARK = "24 hours"  # the events span six hours: no state is evicted before its duplicates arrive
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@dataclass
class PeerRun:
    contender: str
    round: int
    seconds: float
    records: int
    rows: int
    distinct_ids: int
    batches: int
    input_rows: int | None  # what the stream's progress reports say it read
    load_avg_1m_before: float
    load_avg_1m_after: float
    rss_before_bytes: int
    peak_rss_bytes: int  # of the driver while timed (`bench.memory`)
    duplicates_after_replay: int | None = None
    replay: dict[str, Any] = field(default_factory=dict)
    examined: Any = None  # what the caller's `examine` made of the table

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds


def events(spark: SparkSession, source: Source, streaming: bool) -> DataFrame:
    """The source files as typed records; an event time in epoch millis becomes a TIMESTAMP."""
    dataset = source.dataset
    if streaming:
        reader = spark.readStream.schema(dataset.reader_schema).option("maxFilesPerTrigger", source.files_per_batch)
        raw = reader.json(str(source.directory))
    else:
        raw = spark.read.schema(dataset.reader_schema).json(str(source.directory))
    if dataset.time_as_millis:
        return raw.withColumn(dataset.time_field, F.timestamp_millis(dataset.time_field))
    return raw


def append_sink(table: str, app_id: str) -> Callable[[DataFrame, int], None]:
    def append(batch: DataFrame, batch_id: int) -> None:
        batch.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", batch_id).save(
            table
        )

    return append


def _merge_sink(table: str, app_id: str, id_field: str) -> Callable[[DataFrame, int], None]:
    from delta.tables import DeltaTable

    def merge(batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession  # the query's own session: the txn settings must be where the MERGE runs
        spark.conf.set(TXN_APP_ID, app_id)
        spark.conf.set(TXN_VERSION, str(batch_id))
        try:
            (
                DeltaTable.forPath(spark, table).alias("t")
                .merge(batch.dropDuplicates([id_field]).alias("s"), f"t.`{id_field}` = s.`{id_field}`")
                .whenNotMatchedInsertAll()
                .execute()
            )
        finally:
            spark.conf.unset(TXN_APP_ID)
            spark.conf.unset(TXN_VERSION)

    return merge


@dataclass(frozen=True)
class _Stream:
    """One streaming contender's query; rebuilt identically (same checkpoint, app id, table) for the replay."""

    contender: str
    source: Source
    table: str
    checkpoint: str
    app_id: str

    def run(self, spark: SparkSession) -> tuple[float, StreamingQuery]:
        """Start the query and wait until it has drained the source; times exactly that."""
        dataset = self.source.dataset
        stream = events(spark, self.source, streaming=True).withWatermark(dataset.time_field, WATERMARK)
        if self.contender == "streaming_dedup":
            stream = stream.dropDuplicatesWithinWatermark([dataset.id_field])
            sink = append_sink(self.table, self.app_id)
        else:
            empty = spark.createDataFrame([], events(spark, self.source, streaming=False).schema)
            empty.write.format("delta").mode("ignore").save(self.table)  # so the first batch is a MERGE too
            sink = _merge_sink(self.table, self.app_id, dataset.id_field)
        writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", self.checkpoint)
        start = time.perf_counter()
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return time.perf_counter() - start, query

    def replay_check(self, spark: SparkSession) -> tuple[int, dict[str, Any]]:
        """Lose the commit-log entry of the last batch that read data (the sink committed it; a crash came before
        the checkpoint said so), run the query again on its checkpoint: the duplicates the table then holds, and
        what the replay did. Trailing no-data batches (run only to move the watermark) could not have run before
        that crash: they go too."""
        id_field = self.source.dataset.id_field
        root, version = Path(self.checkpoint), RsDeltaTable(self.table).version()
        rows, _, _ = _table_counts(self.table, id_field)
        last = max(int(p.name) for p in (root / "commits").iterdir() if p.name.isdigit())
        dropped: list[int] = []
        while last > 0 and _source_offset(root, last) == _source_offset(root, last - 1):
            _delete(root / "offsets", last)
            _delete(root / "commits", last)
            dropped, last = [*dropped, last], last - 1
        _delete(root / "commits", last)
        runs = self._replay(spark)
        if not (root / "commits" / str(last)).exists():
            raise BenchmarkError(f"{self.contender}: the replay did not run batch {last} again (no commit for it)")
        rows_after, _, repeated = _table_counts(self.table, id_field)
        report = {"replayed_batch": last, "dropped_no_data_batches": dropped, "runs": runs,
                  "failed_runs": [r["failure"] for r in runs if r["failure"]],
                  "table_commits": RsDeltaTable(self.table).version() - version, "rows_added": rows_after - rows}
        return repeated, report

    def _replay(self, spark: SparkSession, tries: int = 3) -> list[dict[str, Any]]:
        """Restart the query on its checkpoint, with Spark's default settings, until a run ends cleanly (as a
        scheduler's retry would); what each run did. Spark (SPARK-52008; in this PySpark 4.2) ends the run that
        replays the batch with STATE_STORE_COMMIT_VALIDATION_FAILED, after committing it: Delta's `txnVersion`
        skip means foreachBatch never executed the batch's stateful plan. The next run goes on normally."""
        runs: list[dict[str, Any]] = []
        for _ in range(tries):
            start = time.perf_counter()
            try:
                _, query = self.run(spark)
            except StreamingQueryException as error:
                failure = _caused_by(error, "STATE_STORE_COMMIT_VALIDATION_FAILED")
                if failure is None:
                    raise
                runs.append({"seconds": time.perf_counter() - start, "failure": failure})
                continue
            progress = [p.batchId for p in query.recentProgress]  # a batch Delta skipped reads 0 input rows
            runs.append({"seconds": time.perf_counter() - start, "failure": None, "progress_batch_ids": progress})
            return runs
        raise BenchmarkError(f"{self.contender}: the replay failed {tries} runs in a row: {runs[-1]['failure']}")


def _source_offset(checkpoint: Path, batch: int) -> str:
    return (checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1]


def _delete(log: Path, batch: int) -> None:
    for name in (str(batch), f".{batch}.crc"):
        (log / name).unlink(missing_ok=True)


def _caused_by(error: BaseException, condition: str) -> str | None:
    """The first line of the exception with `condition` in `error`'s cause chain, if any. PySpark keeps the
    converted Java cause only in `_cause`; the STREAM_FAILED summary says just "Exception thrown in awaitResult"."""
    seen: BaseException | None = error
    while seen is not None:
        if condition in str(seen):
            return str(seen).splitlines()[0]
        seen = getattr(seen, "_cause", None)
    return None


def _table_counts(table: str, id_field: str) -> tuple[int, int, int]:
    """Rows, distinct IDs, and rows that repeat an ID (a malformed line's row without an ID repeats none)."""
    ids = RsDeltaTable(table).to_pyarrow_table(columns=[id_field]).column(id_field)
    distinct = pc.count_distinct(ids).as_py()
    return len(ids), distinct, len(ids) - ids.null_count - distinct


def run_contender(
    spark: SparkSession, contender: str, source: Source, work: Path, round_no: int, replay: bool = True,
    examine: Callable[[str], Any] | None = None,
) -> PeerRun:
    """One timed run of `contender` into a fresh table under `work` (removed afterwards); `examine` looks at the
    table (its path) before the replay check, its result kept as `examined`; for a stream, with `replay`, then the
    replay check."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{contender}-", dir=work))
    table = str(scratch / "table")
    try:
        load_before, input_rows = os.getloadavg()[0], None
        stream = _Stream(contender, source, table, str(scratch / "checkpoint"), f"bench-{uuid.uuid4().hex}")
        with PeakRss() as rss:
            if contender == "floor":
                start = time.perf_counter()
                events(spark, source, streaming=False).write.format("delta").mode("append").save(table)
                seconds, batches = time.perf_counter() - start, 1
            else:
                seconds, query = stream.run(spark)
                batches, input_rows = len(query.recentProgress), sum(p.numInputRows for p in query.recentProgress)
        load_after = os.getloadavg()[0]
        rows, distinct, _ = _table_counts(table, source.dataset.id_field)
        result = PeerRun(contender, round_no, seconds, source.records, rows, distinct, batches, input_rows,
                         load_before, load_after, rss.before, rss.peak, examined=examine and examine(table))
        if contender != "floor" and replay:
            result.duplicates_after_replay, result.replay = stream.replay_check(spark)
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check(run: PeerRun, source: Source) -> None:
    """Fail loudly unless the stream read every record and the table's counts can hold what the contender promises:
    every valid record once (the floor: every line), beside at most one row per malformed line (its values, and
    whether it holds the valid rows' values: `bench.same_rows`)."""
    expected_rows = source.records - source.malformed if run.contender == "floor" else source.events
    problems = []
    if not expected_rows <= run.rows <= expected_rows + source.malformed:
        problems.append(f"table has {run.rows} rows, expected {expected_rows} (+ up to {source.malformed} malformed)")
    if not source.events <= run.distinct_ids <= source.events + source.malformed:
        problems.append(f"table has {run.distinct_ids} distinct ids, expected {source.events} "
                        f"(+ up to {source.malformed} malformed)")
    if run.input_rows is not None and run.input_rows != run.records:
        problems.append(f"the stream read {run.input_rows} records, expected {run.records}")
    if problems:
        raise BenchmarkError(f"{run.contender} round {run.round} ({source.dataset.name}): " + "; ".join(problems))
