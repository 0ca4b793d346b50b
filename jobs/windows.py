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
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from jobs.delta_txn import latest_version
from jobs.ingest import BUCKET_FORMAT
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


def _window_filter(window: Window) -> str:
    return (
        f"event_time >= timestamp_millis({window.start_ms}) AND event_time < timestamp_millis({window.end_ms}) "
        f"AND time_bucket BETWEEN date_format(timestamp_millis({window.start_ms}), '{BUCKET_FORMAT}') "
        f"AND date_format(timestamp_millis({window.end_ms - 1}), '{BUCKET_FORMAT}')"
    )


def raw_rows_in_window(spark: SparkSession, raw_path: str, window: Window, version: int, after_batch: int = 0) -> int:
    """Rows of the raw table at `version` with event time in the window (and batch id above `after_batch`)."""
    return int(
        spark.sql(
            f"SELECT count(*) AS n FROM delta.`{raw_path}` VERSION AS OF {version} "
            f"WHERE {_window_filter(window)} AND batch_id > {after_batch}"
        ).collect()[0]["n"]
    )


def materialize_window(
    spark: SparkSession,
    pipeline: Pipeline,
    window: Window,
    watermark_ms: int | None,
    closes: CloseStore,
    raw_path: str,
    windows_path: str,
) -> WindowResult:
    """Compute the window's current pane and MERGE it into the window table (see the module docstring)."""
    ensure_windows_table(spark, windows_path)
    latest = latest_version(spark, raw_path)
    closed = watermark_ms is not None and watermark_ms >= window.end_ms + pipeline.allowed_lateness_s * 1000
    close = closes.latest(window)
    if close is None and closed:
        close = closes.close(window, _new_close(spark, raw_path, window, 1, ON_TIME, latest, watermark_ms))
        crash_point("window.after_close")
    elif (
        close is not None
        and pipeline.late_policy == "refire"
        and raw_rows_in_window(spark, raw_path, window, latest, after_batch=close.max_batch_id) > 0
    ):
        close = closes.close(window, _new_close(spark, raw_path, window, close.pane + 1, LATE, latest, watermark_ms))
        crash_point("window.after_close")

    if close is None:
        pane, timing, version = 0, EARLY, latest
    else:
        pane, timing, version = close.pane, close.timing, close.raw_version
    records, keys = _merge_pane(spark, raw_path, windows_path, window, version, pane, timing)
    crash_point("window.after_merge")
    late = 0 if close is None else raw_rows_in_window(spark, raw_path, window, latest, after_batch=close.max_batch_id)
    return WindowResult(window, pane, timing, version, close is not None, records, keys, late, latest, watermark_ms)


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


def _merge_pane(
    spark: SparkSession, raw_path: str, windows_path: str, window: Window, version: int, pane: int, timing: str
) -> tuple[int, int]:
    """Replace the window's rows with the pane computed from `raw VERSION AS OF version`.

    A pane never overwrites a newer one: a stale retry of an earlier pane changes nothing.
    """
    result = spark.sql(
        f"SELECT timestamp_millis({window.start_ms}) AS window_start, timestamp_millis({window.end_ms}) AS window_end, "
        f"key, count(*) AS count, CAST(sum(value) AS DECIMAL(38, 9)) AS sum_value, "
        f"CAST({version} AS BIGINT) AS raw_version, {pane} AS pane, '{timing}' AS timing "
        f"FROM delta.`{raw_path}` VERSION AS OF {version} WHERE {_window_filter(window)} GROUP BY key"
    ).cache()
    try:
        totals = result.selectExpr("coalesce(sum(count), 0) AS n", "count(*) AS k").collect()[0]
        view = f"onceflow_pane_{window.start_ms}_{pane}"
        result.createOrReplaceTempView(view)
        in_window = f"t.window_start = timestamp_millis({window.start_ms})"
        spark.sql(
            f"MERGE INTO delta.`{windows_path}` t USING {view} s "
            f"ON {in_window} AND t.window_start = s.window_start AND t.key = s.key "
            "WHEN MATCHED AND s.pane >= t.pane THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT * "
            f"WHEN NOT MATCHED BY SOURCE AND {in_window} AND t.pane <= {pane} THEN DELETE"
        )
        spark.catalog.dropTempView(view)
        return int(totals["n"]), int(totals["k"])
    finally:
        result.unpersist()
