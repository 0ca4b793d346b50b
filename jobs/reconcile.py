"""Reconciliation: per window, every record received is accounted for exactly once.

For each event-time window (and `unassigned`, for records without a usable event time):

    received = inserted + duplicates + late + dead_lettered

`received`, `duplicates` and `dead_lettered` are recomputed from the immutable landed batches (every committed
batch, classified again exactly as ingest did; a duplicate is a valid record whose ID occurred earlier in landing
order); `inserted` and `late` are read from the raw table (its rows of the window from batches up to, and after,
the batch the window closed at). The two sides come from different data, so a record lost or written twice by
ingest breaks the equation. Then the output: the window table's `sum(count)` must equal `inserted` (plus `late`
for a refired late pane), and a closed window's final pane must be published (its commit sequence done).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window as SparkWindow

from jobs.commit_steps import sequence_id
from jobs.ingest import classify
from jobs.micro_batch import SourceHandles, landed_frame
from jobs.pipeline import Pipeline
from jobs.windows import CloseStore, Window
from resources.commit_store import DONE, CommitStore

UNASSIGNED = "unassigned"
SPARK_PARTITION_FORMAT = "yyyy-MM-dd-HH:mm"  # `jobs.windows.PARTITION_FORMAT` in Spark's pattern language


@dataclass(frozen=True)
class WindowReconciliation:
    """One window's accounting; `window` is its partition key, or `unassigned`."""

    window: str
    received: int
    inserted: int
    duplicates: int
    late: int
    dead_lettered: int
    closed: bool = False
    pane: int | None = None
    output: int = 0
    published: bool = False

    @property
    def balanced(self) -> bool:
        return self.received == self.inserted + self.duplicates + self.late + self.dead_lettered

    @property
    def output_matches(self) -> bool:
        if self.window == UNASSIGNED:
            return True
        if not self.closed:
            return True  # an open window's early pane may lag the raw table
        return self.output == self.inserted + (self.late if (self.pane or 0) > 1 else 0)

    @property
    def ok(self) -> bool:
        return self.balanced and self.output_matches and (self.published or not self.closed or self.window == UNASSIGNED)


def landed_records(spark: SparkSession, pipeline: Pipeline, handles: SourceHandles) -> DataFrame | None:
    """Every record of every committed batch, classified as ingest classified it: (batch_id, ordinal,
    record_id, event_time, reason)."""
    frames = []
    for batch in range(1, handles.checkpoints.load().committed_batch + 1):
        plan = handles.checkpoints.get_plan(batch)
        if plan is None:
            raise RuntimeError(f"{pipeline.source_id}: batch {batch} is committed but its plan is missing")
        frames.append(
            classify(pipeline, plan, landed_frame(spark, plan, handles)).select(
                F.lit(batch).cast("bigint").alias("batch_id"), "ordinal", "record_id", "event_time", "reason"
            )
        )
    if not frames:
        return None
    landed = frames[0]
    for frame in frames[1:]:
        landed = landed.unionByName(frame)
    return landed


def _window_key(pipeline: Pipeline) -> F.Column:
    """The partition key of the window holding `event_time`; `unassigned` when there is none."""
    window_ms = pipeline.window_s * 1000
    start = F.expr(f"timestamp_millis(floor(unix_millis(event_time) / {window_ms}) * {window_ms})")
    return F.coalesce(F.date_format(start, SPARK_PARTITION_FORMAT), F.lit(UNASSIGNED))


def reconcile(
    spark: SparkSession,
    pipeline: Pipeline,
    handles: SourceHandles,
    closes: CloseStore,
    commits: CommitStore,
    windows_path: str,
) -> list[WindowReconciliation]:
    """The reconciliation of every window that received records, in window order (`unassigned` last)."""
    landed = landed_records(spark, pipeline, handles)
    if landed is None:
        return []
    # Among valid records, the first of an ID in landing order is the one ingest kept; the others are duplicates.
    valid_first = SparkWindow.partitionBy("record_id", F.col("reason").isNull()).orderBy("batch_id", "ordinal")
    landed = landed.withColumn("w", _window_key(pipeline)).withColumn(
        "n", F.when(F.col("reason").isNull(), F.row_number().over(valid_first))
    )
    received = {
        r["w"]: (int(r["received"]), int(r["dead"]), int(r["dups"]))
        for r in landed.groupBy("w").agg(
            F.count("*").alias("received"),
            F.count("reason").alias("dead"),
            F.sum(F.when(F.col("n") > 1, 1).otherwise(0)).alias("dups"),
        ).collect()
    }
    windows = {k: Window.from_partition_key(k, pipeline.window_s) for k in received if k != UNASSIGNED}
    closes_by_key = {k: closes.latest(w) for k, w in windows.items()}
    bounds = ", ".join(
        f"('{k}', {c.max_batch_id if c else 'CAST(NULL AS BIGINT)'})" for k, c in closes_by_key.items()
    ) or "('', CAST(NULL AS BIGINT))"
    raw = spark.read.format("delta").load(handles.raw_path).withColumn("w", _window_key(pipeline))
    raw_counts = {
        r["w"]: (int(r["inserted"]), int(r["late"]))
        for r in raw.join(spark.sql(f"SELECT * FROM VALUES {bounds} AS b(w, max_batch)"), "w", "left")
        .groupBy("w")
        .agg(
            F.sum(F.when(F.col("max_batch").isNull() | (F.col("batch_id") <= F.col("max_batch")), 1).otherwise(0))
            .alias("inserted"),
            F.sum(F.when(F.col("batch_id") > F.col("max_batch"), 1).otherwise(0)).alias("late"),
        )
        .collect()
    }
    output: dict[str, int] = {}
    try:
        table = spark.read.format("delta").load(windows_path)
        for r in table.groupBy(F.date_format("window_start", SPARK_PARTITION_FORMAT).alias("w")).agg(
            F.sum("count").alias("n")
        ).collect():
            output[r["w"]] = int(r["n"])
    except Exception as error:  # no window table yet: nothing was output
        if "DELTA_MISSING_DELTA_TABLE" not in str(error) and "is not a Delta table" not in str(error):
            raise
    results = []
    for key in sorted(received, key=lambda k: (k == UNASSIGNED, k)):
        got, dead, dups = received[key]
        inserted, late = raw_counts.get(key, (0, 0))
        close = closes_by_key.get(key)
        published = False
        if close is not None:
            seq = sequence_id(pipeline.window_asset, key, close.pane)
            published = commits.get(seq) is not None and commits.state(seq).status == DONE
        results.append(
            WindowReconciliation(
                key, got, inserted, dups, late, dead, close is not None, close.pane if close else None,
                output.get(key, 0), published,
            )
        )
    return results


def render(rows: list[WindowReconciliation]) -> str:
    """The reconciliation as a table, one line per window."""
    header = (f"{'window':<17} {'received':>8} {'inserted':>8} {'dupes':>6} {'late':>5} {'dead':>5} "
              f"{'output':>7} {'pane':>5} {'published':>9}  ok")
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.window:<17} {r.received:>8} {r.inserted:>8} {r.duplicates:>6} {r.late:>5} {r.dead_lettered:>5} "
            f"{r.output:>7} {r.pane if r.pane is not None else '-':>5} {'yes' if r.published else 'no':>9}  "
            f"{'ok' if r.ok else 'MISMATCH'}"
        )
    return "\n".join(lines)
