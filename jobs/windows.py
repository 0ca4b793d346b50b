"""Window: one event-time window's result, computed from a pinned version of the raw table.

A window `[start, end)` closes when the source watermark passes `end + allowed_lateness`. Closing records, once,
the raw table's Delta version `v` (a `PaneClose`); the window's result is computed from `raw VERSION AS OF v`, so
every retry and every backfill computes the same result (Dataflow's stable input, done with Delta time travel).
The result is MERGEd into the window table keyed on `(window_start, key)`, replacing exactly that window.

Panes: pane 0 is an early pane (the window has not closed; recomputed from the latest raw version, replaced by
the final pane); pane 1 is the on-time pane fixed at the close; under the `refire` late policy each later
materialization that finds late records closes a new late pane 2, 3, ... at a newer version. Under `drop` late
records stay in raw and are counted.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.delta_txn import latest_version
from jobs.ingest import BUCKET_FORMAT, ensure_raw_table
from jobs.pipeline import Pipeline
from resources.faults import crash_point
from resources.object_store import ObjectStore

WINDOW_COLUMNS = """
    window_start TIMESTAMP NOT NULL, window_end TIMESTAMP NOT NULL, key STRING NOT NULL, count BIGINT NOT NULL,
    sum_value DECIMAL(38, 9) NOT NULL, raw_version BIGINT NOT NULL, pane INT NOT NULL, timing STRING NOT NULL
"""
PARTITION_FORMAT = "%Y-%m-%d-%H:%M"
EARLY, ON_TIME, LATE = "early", "on_time", "late"


@dataclass(frozen=True)
class Window:
    """An event-time window `[start_ms, end_ms)`."""

    start_ms: int
    end_ms: int

    @classmethod
    def from_partition_key(cls, key: str, window_s: int) -> Window:
        start = datetime.strptime(key, PARTITION_FORMAT).replace(tzinfo=UTC)
        start_ms = int(start.timestamp() * 1000)
        return cls(start_ms, start_ms + window_s * 1000)

    @property
    def key(self) -> str:
        return datetime.fromtimestamp(self.start_ms / 1000, UTC).strftime(PARTITION_FORMAT)


@dataclass(frozen=True)
class PaneClose:
    """The durable record that pane `pane` of a window was closed at raw version `raw_version`.

    `max_batch_id` is the newest batch in raw at that version: rows of later batches are late.
    """

    window_start_ms: int
    pane: int
    timing: str
    raw_version: int
    max_batch_id: int
    watermark_ms: int | None
    closed_at_ms: int


class CloseStore:
    """Pane closes of one window asset; each is written once and never changes."""

    def __init__(self, store: ObjectStore, asset: str) -> None:
        self.store = store
        self.asset = asset

    def _prefix(self, window: Window) -> str:
        return f"{self.asset}/closes/{window.start_ms:015d}/"

    def latest(self, window: Window) -> PaneClose | None:
        keys = self.store.list(self._prefix(window))
        if not keys:
            return None
        data = self.store.read(keys[-1])
        return PaneClose(**json.loads(data)) if data else None

    def windows(self, window_s: int) -> list[Window]:
        """Every window with a close, oldest first."""
        starts = sorted({int(k.split("/")[-2]) for k in self.store.list(f"{self.asset}/closes/")})
        return [Window(start, start + window_s * 1000) for start in starts]

    def close(self, window: Window, close: PaneClose) -> PaneClose:
        """Record `close` unless that pane was closed already; return the close that stands."""
        key = f"{self._prefix(window)}pane-{close.pane:04d}.json"
        if self.store.create(key, json.dumps(asdict(close), sort_keys=True).encode()):
            return close
        data = self.store.read(key)
        assert data is not None
        return PaneClose(**json.loads(data))


@dataclass
class WindowResult:
    """What materializing one window did, with its reconciliation numbers."""

    window: Window
    pane: int
    timing: str
    raw_version: int
    closed: bool
    records: int
    keys: int
    late: int
    latest_raw_version: int
    watermark_ms: int | None


def ensure_windows_table(spark: SparkSession, path: str) -> None:
    spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({WINDOW_COLUMNS}) USING delta")


def _range_filter(windows: list[Window]) -> str:
    """Event-time bounds covering all windows, with the time-bucket predicate that prunes raw's partitions."""
    lo, hi = min(w.start_ms for w in windows), max(w.end_ms for w in windows)
    return (
        f"event_time >= timestamp_millis({lo}) AND event_time < timestamp_millis({hi}) "
        f"AND time_bucket BETWEEN date_format(timestamp_millis({lo}), '{BUCKET_FORMAT}') "
        f"AND date_format(timestamp_millis({hi - 1}), '{BUCKET_FORMAT}')"
    )


def rows_per_window(
    spark: SparkSession, raw_path: str, version: int, after_batch: dict[Window, int]
) -> dict[Window, int]:
    """Rows of raw at `version` per window, counting only batch ids above the window's bound (0: all rows).

    One scan for all windows, so a backfill over many windows costs one query, not one per window.
    """
    if not after_batch:
        return {}
    values = ", ".join(f"({w.start_ms}, {w.end_ms}, {bound})" for w, bound in after_batch.items())
    rows = spark.sql(
        f"SELECT w.s, count(r.event_time) AS n FROM (VALUES {values}) AS w(s, e, after) "
        f"LEFT JOIN (SELECT event_time, batch_id FROM delta.`{raw_path}` VERSION AS OF {version} "
        f"WHERE {_range_filter(list(after_batch))}) r "
        "ON r.event_time >= timestamp_millis(w.s) AND r.event_time < timestamp_millis(w.e) AND r.batch_id > w.after "
        "GROUP BY w.s"
    ).collect()
    by_start = {w.start_ms: w for w in after_batch}
    return {by_start[int(row["s"])]: int(row["n"]) for row in rows}


def materialize_windows(
    spark: SparkSession,
    pipeline: Pipeline,
    windows: list[Window],
    watermark_ms: int | None,
    closes: CloseStore,
    raw_path: str,
    windows_path: str,
) -> list[WindowResult]:
    """Compute each window's current pane and MERGE them all into the window table (see the module docstring)."""
    if not windows:
        return []
    ensure_raw_table(spark, raw_path)  # a window materialized before any data is simply empty
    ensure_windows_table(spark, windows_path)
    latest = latest_version(spark, raw_path)
    lateness_ms = pipeline.allowed_lateness_s * 1000
    existing = {w: closes.latest(w) for w in windows}
    if pipeline.late_policy == "refire":
        refire = rows_per_window(spark, raw_path, latest, {w: c.max_batch_id for w, c in existing.items() if c})
    else:
        refire = {}
    panes: dict[Window, PaneClose | None] = {}
    for window in windows:
        close = existing[window]
        if close is None and watermark_ms is not None and watermark_ms >= window.end_ms + lateness_ms:
            close = closes.close(window, _new_close(spark, raw_path, window, 1, ON_TIME, latest, watermark_ms))
            crash_point("window.after_close")
        elif close is not None and refire.get(window, 0) > 0:
            close = closes.close(window, _new_close(spark, raw_path, window, close.pane + 1, LATE, latest, watermark_ms))
            crash_point("window.after_close")
        panes[window] = close

    totals = _merge_panes(spark, raw_path, windows_path, latest, panes)
    crash_point("window.after_merge")
    late = rows_per_window(spark, raw_path, latest, {w: c.max_batch_id for w, c in panes.items() if c})
    results = []
    for window, close in panes.items():
        records, keys = totals.get(window, (0, 0))
        version = latest if close is None else close.raw_version
        pane, timing = (0, EARLY) if close is None else (close.pane, close.timing)
        results.append(
            WindowResult(
                window, pane, timing, version, close is not None, records, keys, late.get(window, 0), latest, watermark_ms
            )
        )
    return results


def _new_close(
    spark: SparkSession, raw_path: str, window: Window, pane: int, timing: str, version: int, watermark_ms: int | None
) -> PaneClose:
    max_batch = spark.sql(f"SELECT max(batch_id) AS b FROM delta.`{raw_path}` VERSION AS OF {version}").collect()[0]["b"]
    return PaneClose(
        window_start_ms=window.start_ms,
        pane=pane,
        timing=timing,
        raw_version=version,
        max_batch_id=int(max_batch or 0),
        watermark_ms=watermark_ms,
        closed_at_ms=int(time.time() * 1000),
    )


def _merge_panes(
    spark: SparkSession, raw_path: str, windows_path: str, latest: int, panes: dict[Window, PaneClose | None]
) -> dict[Window, tuple[int, int]]:
    """Replace each window's rows with its pane, computed from `raw VERSION AS OF` the pane's version.

    One aggregation per distinct version and one MERGE for all windows. A pane never overwrites a newer one: a
    stale retry of an earlier pane changes nothing. Returns (records, keys) per window.
    """
    by_version: dict[int, list[tuple[Window, int, str]]] = {}
    for window, close in panes.items():
        if close is None:
            by_version.setdefault(latest, []).append((window, 0, EARLY))
        else:
            by_version.setdefault(close.raw_version, []).append((window, close.pane, close.timing))
    parts = []
    for version, items in by_version.items():
        values = ", ".join(f"({w.start_ms}, {w.end_ms}, {pane}, '{timing}')" for w, pane, timing in items)
        parts.append(
            spark.sql(
                "SELECT timestamp_millis(w.s) AS window_start, timestamp_millis(w.e) AS window_end, r.key, "
                "count(*) AS count, CAST(sum(r.value) AS DECIMAL(38, 9)) AS sum_value, "
                f"CAST({version} AS BIGINT) AS raw_version, CAST(w.pane AS INT) AS pane, w.timing "
                f"FROM (SELECT key, value, event_time FROM delta.`{raw_path}` VERSION AS OF {version} "
                f"WHERE {_range_filter([w for w, _, _ in items])}) r "
                f"JOIN (VALUES {values}) AS w(s, e, pane, timing) "
                "ON r.event_time >= timestamp_millis(w.s) AND r.event_time < timestamp_millis(w.e) "
                "GROUP BY w.s, w.e, r.key, w.pane, w.timing"
            )
        )
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    result = result.cache()
    try:
        totals = {
            int(row["s"]): (int(row["n"]), int(row["k"]))
            for row in result.groupBy("window_start")
            .agg(F.expr("unix_millis(window_start) AS s"), F.sum("count").alias("n"), F.count("*").alias("k"))
            .collect()
        }
        view = f"onceflow_panes_{uuid.uuid4().hex}"
        result.createOrReplaceTempView(view)
        starts = ", ".join(f"timestamp_millis({w.start_ms})" for w in panes)
        stale = " OR ".join(
            f"(t.window_start = timestamp_millis({w.start_ms}) AND t.pane <= {0 if c is None else c.pane})"
            for w, c in panes.items()
        )
        spark.sql(
            f"MERGE INTO delta.`{windows_path}` t USING {view} s "
            f"ON t.window_start IN ({starts}) AND t.window_start = s.window_start AND t.key = s.key "
            "WHEN MATCHED AND s.pane >= t.pane THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT * "
            f"WHEN NOT MATCHED BY SOURCE AND ({stale}) THEN DELETE"
        )
        spark.catalog.dropTempView(view)
    finally:
        result.unpersist()
    return {w: totals.get(w.start_ms, (0, 0)) for w in panes}


def pane_rows(spark: SparkSession, windows_path: str, window: Window, pane: int) -> pa.Table:
    """The rows of `window` in the window table, which must hold pane `pane` (or nothing: an empty pane).

    Raises `RuntimeError` if the table holds another pane of the window, e.g. a newer one merged by a concurrent
    run: publishing reads exactly the pane it was asked to publish.
    """
    table = spark.sql(
        f"SELECT * FROM delta.`{windows_path}` WHERE window_start = timestamp_millis({window.start_ms})"
    ).toArrow()
    found = set(table.column("pane").to_pylist())
    if found - {pane}:
        raise RuntimeError(f"window {window.key} holds panes {sorted(found)} in {windows_path}, not pane {pane}")
    return table
