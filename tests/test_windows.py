"""Windowed outputs: final panes from a pinned raw version, late data (drop and refire), idempotent recomputes."""

from __future__ import annotations

import dataclasses
import json
import time
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import FileSink, Pipeline, WindowedOutput
from onceflow.jobs.declare.sources import FileSource
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import OutputError, materialize_windows
from onceflow.orchestration.pipelines import resolve
from onceflow.orchestration.pipelines.events import SCHEMA, event_counts
from onceflow.orchestration.workload import Event
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings
from tests.delta_reader import read_rows
from tests.pipelines import drain

WINDOW_ROWS = ["window_start", "key", "count", "sum_value", "pane", "timing"]
LATENESS_MS = 30_000


def minute_base() -> int:
    """A window-aligned start two hours ago, so the windows fall inside the asset's partitions."""
    now = int(time.time() * 1000)
    return (now - 2 * 3600_000) // 60_000 * 60_000


def write_events(path: Path, events: list[Event]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(e.json_line() + "\n" for e in events))


def five_window_workload(base: int) -> tuple[list[Event], list[Event], list[Event]]:
    """On-time events in windows 0..4, late ones for windows 0 and 1, and later on-time ones for 3 and 4."""
    on_time = [Event(f"on{w}-{i}", base + w * 60_000 + i * 997, f"k{i % 3}", w * 10 + i) for w in range(5) for i in range(12)]
    late = [Event(f"late{w}-{i}", base + w * 60_000 + 5_000 + i, f"k{i % 2}", 1000 + i) for w in (0, 1) for i in range(4)]
    more = [Event(f"more{w}-{i}", base + w * 60_000 + 40_000 + i, "k9", 7) for w in (3, 4) for i in range(3)]
    return on_time, late, more


def expected_rows(base: int, events: list[Event], windows: range, pane: int, timing: str) -> list[tuple]:
    from datetime import UTC, datetime

    groups: dict[tuple[int, str], list[int]] = {}
    for e in events:
        w = (e.event_time_ms - base) // 60_000
        if w in windows:
            groups.setdefault((w, e.key), []).append(e.value)
    return sorted(
        (
            datetime.fromtimestamp((base + w * 60_000) / 1000, UTC),
            key,
            len(values),
            Decimal(sum(values)).quantize(Decimal("1.000000000")),
            pane,
            timing,
        )
        for (w, key), values in groups.items()
    )


def file_pipeline(directory: Path, late_policy: str = "drop") -> Pipeline:
    """`events` over files: one output, `event_counts`, with 1-minute windows and 30 s of allowed lateness."""
    output = WindowedOutput(
        asset="event_counts", window="1m", allowed_lateness="30s", late_policy=late_policy, keys=["key"],
        transform=event_counts, sinks=[FileSink()],
    )
    source = FileSource(directory=str(directory), id_field="event_id", timestamp_field="event_time")
    return resolve(Pipeline(name="events", source=source, schema=SCHEMA, outputs=[output]), load_settings())


@pytest.mark.parametrize("late_policy", ["drop", "refire"])
def test_final_windows_count_on_time_events_and_late_ones_are_accounted(
    spark: SparkSession, tmp_path: Path, home: Path, late_policy: str
) -> None:
    base = minute_base()
    on_time, late, more = five_window_workload(base)
    pipeline = file_pipeline(tmp_path / "in", late_policy)
    lake = LakeResource(home=str(home))
    output = pipeline.outputs[0]
    source = open_source(pipeline, lake)
    closes = CloseStore(lake.panes(), output.asset)
    windows = [Window(base + w * 60_000, base + (w + 1) * 60_000) for w in range(5)]
    windows_path = lake.table_path(output.table)

    def materialize(ws: list[Window], watermark_ms: int) -> list:
        return materialize_windows(spark, pipeline, output, ws, watermark_ms, closes, source.raw_path, windows_path)

    write_events(tmp_path / "in" / "1.jsonl", on_time)
    drain(lambda: spark, source)
    first = materialize(windows[:3], windows[2].end_ms + LATENESS_MS)  # windows 0-2 close
    early = materialize(windows[3:], windows[2].end_ms + LATENESS_MS)  # 3-4 still open: early panes
    assert [(r.pane, r.timing, r.closed) for r in first + early] == [(1, "on_time", True)] * 3 + [(0, "early", False)] * 2

    write_events(tmp_path / "in" / "2.jsonl", late + more)
    drain(lambda: spark, source)
    final = materialize(windows, windows[4].end_ms + LATENESS_MS)

    table = read_rows(windows_path, WINDOW_ROWS)
    if late_policy == "drop":
        assert [r.late for r in final] == [4, 4, 0, 0, 0]
        assert [(r.pane, r.timing) for r in final] == [(1, "on_time")] * 5
        assert table == sorted(
            expected_rows(base, on_time, range(3), 1, "on_time")
            + expected_rows(base, on_time + more, range(3, 5), 1, "on_time")
        )
    else:
        assert [(r.pane, r.timing) for r in final] == [(2, "late"), (2, "late"), (1, "on_time"), (1, "on_time"), (1, "on_time")]
        assert [r.late for r in final] == [0, 0, 0, 0, 0]
        assert table == sorted(
            expected_rows(base, on_time + late, range(2), 2, "late")
            + expected_rows(base, on_time, range(2, 3), 1, "on_time")
            + expected_rows(base, on_time + more, range(3, 5), 1, "on_time")
        )
    # The raw table keeps every record, late ones included.
    assert len(read_rows(source.raw_path, ["record_id"])) == len(on_time) + len(late) + len(more)

    # Recomputing (a retry, a backfill) changes nothing, row for row.
    full = read_rows(windows_path, [*WINDOW_ROWS, "window_end", "raw_version"])
    materialize(windows, windows[4].end_ms + LATENESS_MS)
    assert read_rows(windows_path, [*WINDOW_ROWS, "window_end", "raw_version"]) == full


def test_a_stale_early_pane_never_overwrites_the_final_pane(spark: SparkSession, tmp_path: Path, home: Path) -> None:
    base = minute_base()
    on_time, _, _ = five_window_workload(base)
    pipeline = file_pipeline(tmp_path / "in")
    lake = LakeResource(home=str(home))
    output = pipeline.outputs[0]
    source = open_source(pipeline, lake)
    windows_path = lake.table_path(output.table)
    window = Window(base, base + 60_000)
    write_events(tmp_path / "in" / "1.jsonl", on_time)
    drain(lambda: spark, source)
    closes = CloseStore(lake.panes(), output.asset)
    materialize_windows(spark, pipeline, output, [window], window.end_ms + LATENESS_MS, closes, source.raw_path, windows_path)
    final = read_rows(windows_path, WINDOW_ROWS)

    # An early-pane run that started before the close and finishes after it.
    empty = CloseStore(lake.landing(), "nothing-closed-here")
    materialize_windows(spark, pipeline, output, [window], None, empty, source.raw_path, windows_path)

    assert read_rows(windows_path, WINDOW_ROWS) == final
    assert {r[-2:] for r in final} == {(1, "on_time")}
    assert json.loads((home / "panes" / "event_counts" / "closes" / f"{base:015d}" / "pane-0001.json").read_text())[
        "raw_version"
    ] >= 1


def test_a_window_materialized_before_any_data_is_empty(spark: SparkSession, tmp_path: Path, home: Path) -> None:
    pipeline = file_pipeline(tmp_path / "in")
    output = pipeline.outputs[0]
    lake = LakeResource(home=str(home))
    base = minute_base()
    window = Window(base, base + 60_000)
    closes = CloseStore(lake.panes(), output.asset)

    (result,) = materialize_windows(
        spark, pipeline, output, [window], window.end_ms + LATENESS_MS, closes,
        lake.table_path(pipeline.raw_table), lake.table_path(output.table),
    )

    assert (result.pane, result.timing, result.records, result.rows, result.late) == (1, "on_time", 0, 0, 0)
    assert read_rows(lake.table_path(output.table), WINDOW_ROWS) == []


def test_a_transform_with_two_rows_for_one_key_is_an_error_naming_it(
    spark: SparkSession, tmp_path: Path, home: Path
) -> None:
    base = minute_base()
    pipeline = file_pipeline(tmp_path / "in")
    output = dataclasses.replace(pipeline.outputs[0], transform=lambda records: records.select("key", "value"))
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    write_events(tmp_path / "in" / "1.jsonl", five_window_workload(base)[0])
    drain(lambda: spark, source)
    window = Window(base, base + 60_000)

    with pytest.raises(OutputError, match=r"event_counts: the transform returned \d+ rows for window .* and key "
                                          r"key='k[0-2]'; it must return one row per value of keys \['key'\]"):
        materialize_windows(spark, pipeline, output, [window], None, CloseStore(lake.panes(), output.asset),
                            source.raw_path, lake.table_path(output.table))
    assert not Path(lake.table_path(output.table)).exists()  # nothing merged, no table made from a wrong result
