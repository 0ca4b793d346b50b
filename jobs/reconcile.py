"""Reconciliation: per window, every record received is accounted for exactly once.

For each event-time window (and `unassigned`, for records without a usable event time):

    received = inserted + duplicates + late + dead_lettered

`received`, `duplicates` and `dead_lettered` are recomputed from the immutable landed batches (every committed
batch, classified again exactly as ingest did; a duplicate is a valid record whose ID occurred earlier in landing
order); `inserted` and `late` are read from the raw table (its rows of the window from batches up to, and after,
the batch the window closed at). The two sides come from different data, so a record lost or written twice by
ingest breaks the equation. Then the output: a closed window's rows in the window table must equal the transform
of the raw table at the version its pane was closed at (recomputed here), and its final pane must be published
(its commit sequence done).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window as SparkWindow

from jobs.commit_steps import sequence_id
from jobs.declaration import WindowedOutput
from jobs.panes import CloseStore, PaneClose, Window
from jobs.source_reader import SourceRuntime
from jobs.validation import RecordContract, classify
from jobs.windows import pane_frame
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
    output_rows: int = 0
    output_matches: bool = True
    published: bool = False

    @property
    def balanced(self) -> bool:
        return self.received == self.inserted + self.duplicates + self.late + self.dead_lettered

    @property
    def ok(self) -> bool:
        return self.balanced and self.output_matches and (self.published or not self.closed or self.window == UNASSIGNED)


def landed_records(spark: SparkSession, source: SourceRuntime) -> DataFrame | None:
    """Every record of every committed batch, classified as ingest classified it: (batch_id, ordinal,
    record_id, event_time, reason)."""
    frames = []
    contract = RecordContract.of(source.pipeline)
    for batch in range(1, source.checkpoints.load().committed_batch + 1):
        plan = source.checkpoints.get_plan(batch)
        if plan is None:
            raise RuntimeError(f"{source.pipeline.source_id}: batch {batch} is committed but its plan is missing")
        landed = source.reader.landed(spark, plan)
        frames.append(
            classify(landed, contract, plan.planned_at_ms, plan.horizon_floor_ms).select(
                F.lit(batch).cast("bigint").alias("batch_id"), "ordinal", "record_id", "event_time", "reason"
            )
        )
    if not frames:
        return None
    landed = frames[0]
    for frame in frames[1:]:
        landed = landed.unionByName(frame)
    return landed


def _window_key(output: WindowedOutput) -> F.Column:
    """The partition key of the window holding `event_time`; `unassigned` when there is none."""
    window_ms = output.window_s * 1000
    start = F.expr(f"timestamp_millis(floor(unix_millis(event_time) / {window_ms}) * {window_ms})")
    return F.coalesce(F.date_format(start, SPARK_PARTITION_FORMAT), F.lit(UNASSIGNED))


def reconcile(
    spark: SparkSession,
    source: SourceRuntime,
    output: WindowedOutput,
    closes: CloseStore,
    commits: CommitStore,
    windows_path: str,
) -> list[WindowReconciliation]:
    """The reconciliation of every window of `output` that received records, in window order (`unassigned` last)."""
    landed = landed_records(spark, source)
    if landed is None:
        return []
    # Among valid records, the first of an ID in landing order is the one ingest kept; the others are duplicates.
    valid_first = SparkWindow.partitionBy("record_id", F.col("reason").isNull()).orderBy("batch_id", "ordinal")
    landed = landed.withColumn("w", _window_key(output)).withColumn(
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
    windows = {k: Window.from_partition_key(k, output.window_s) for k in received if k != UNASSIGNED}
    closes_by_key = {k: closes.latest(w) for k, w in windows.items()}
    bounds = ", ".join(
        f"('{k}', {c.max_batch_id if c else 'CAST(NULL AS BIGINT)'})" for k, c in closes_by_key.items()
    ) or "('', CAST(NULL AS BIGINT))"
    raw = spark.read.format("delta").load(source.raw_path).withColumn("w", _window_key(output))
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
    closed = {windows[k]: c for k, c in closes_by_key.items() if c is not None}
    rows, matches = _closed_outputs(spark, source, output, windows_path, closed)
    results = []
    for key in sorted(received, key=lambda k: (k == UNASSIGNED, k)):
        got, dead, dups = received[key]
        inserted, late = raw_counts.get(key, (0, 0))
        close = closes_by_key.get(key)
        published = False
        if close is not None:
            seq = sequence_id(output.asset, key, close.pane)
            published = commits.get(seq) is not None and commits.state(seq).status == DONE
        results.append(
            WindowReconciliation(
                key, got, inserted, dups, late, dead, close is not None, close.pane if close else None,
                rows.get(key, 0), matches.get(key, True), published,
            )
        )
    return results


def _closed_outputs(
    spark: SparkSession,
    source: SourceRuntime,
    output: WindowedOutput,
    windows_path: str,
    closed: dict[Window, PaneClose],
) -> tuple[dict[str, int], dict[str, bool]]:
    """Per closed window: its rows in the window table, and whether they equal the transform recomputed from raw
    at the pane's version."""
    if not closed:
        return {}, {}
    table = spark.read.format("delta").load(windows_path).withColumn("w", F.date_format("window_start", SPARK_PARTITION_FORMAT))
    rows = {r["w"]: int(r["n"]) for r in table.groupBy("w").agg(F.count("*").alias("n")).collect()}
    by_version: dict[int, list[tuple[Window, int, str]]] = {}
    for window, close in closed.items():
        by_version.setdefault(close.raw_version, []).append((window, close.pane, close.timing))
    differing: set[str] = set()
    held = table.drop("w")
    for version, panes in by_version.items():
        _, expected = pane_frame(spark, source.pipeline, output, source.raw_path, version, panes)
        mine = held.filter(F.col("window_start").isin(*[F.timestamp_millis(F.lit(w.start_ms)) for w, _, _ in panes]))
        diff = expected.exceptAll(mine).unionByName(mine.exceptAll(expected))
        differing |= {r["w"] for r in diff.select(F.date_format("window_start", SPARK_PARTITION_FORMAT).alias("w")).distinct().collect()}
    return rows, {w.key: w.key not in differing for w in closed}


def render(rows: list[WindowReconciliation]) -> str:
    """The reconciliation as a table, one line per window."""
    header = (f"{'window':<17} {'received':>8} {'inserted':>8} {'dupes':>6} {'late':>5} {'dead':>5} "
              f"{'rows':>7} {'pane':>5} {'published':>9}  ok")
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.window:<17} {r.received:>8} {r.inserted:>8} {r.duplicates:>6} {r.late:>5} {r.dead_lettered:>5} "
            f"{r.output_rows:>7} {r.pane if r.pane is not None else '-':>5} {'yes' if r.published else 'no':>9}  "
            f"{'ok' if r.ok else 'MISMATCH'}"
        )
    return "\n".join(lines)
