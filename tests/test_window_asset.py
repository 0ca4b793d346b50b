"""The `event_counts` asset through Dagster's command line: repeated materializations, backfills, crashes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.micro_batch import source_handles, source_watermark_ms
from jobs.windows import CloseStore, Window, materialize_windows
from orchestration.pipelines import events_pipeline
from resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import dagster_materialize, drain
from tests.test_windows import WINDOW_ROWS, expected_rows, five_window_workload, minute_base, write_events

ALL_COLUMNS = [*WINDOW_ROWS, "window_end", "raw_version"]


@pytest.fixture
def ingested(spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch):
    """Five windows of on-time events ingested through the file source; the watermark closes some of them."""
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(tmp_path / "in"))
    base = minute_base()
    on_time, _, _ = five_window_workload(base)
    write_events(tmp_path / "in" / "1.jsonl", on_time)
    pipeline = events_pipeline()
    lake = LakeResource(home=str(home))
    handles = source_handles(pipeline, lake, None)
    drain(lambda: spark, pipeline, handles)
    watermark = source_watermark_ms(handles.checkpoints.load())
    assert watermark is not None
    windows = [Window(base + w * 60_000, base + (w + 1) * 60_000) for w in range(5)]
    closed = [w.end_ms + pipeline.allowed_lateness_s * 1000 <= watermark for w in windows]
    assert closed[0] and not closed[-1]  # some windows final, some still open
    return pipeline, lake, base, on_time, windows, closed


def expected_table(base: int, on_time: list, closed: list[bool], indexes: range) -> list[tuple]:
    rows = []
    for w in indexes:
        pane, timing = (1, "on_time") if closed[w] else (0, "early")
        rows += expected_rows(base, on_time, range(w, w + 1), pane, timing)
    return sorted(rows)


def test_materializing_twice_and_backfilling_twice_leave_the_table_identical(ingested, home: Path) -> None:
    pipeline, lake, base, on_time, windows, closed = ingested
    windows_path = lake.table_path(pipeline.windows_table)
    settings = {"events_source": "files", "events_dir": str(Path(pipeline.source.directory))}

    for _ in range(2):
        run = dagster_materialize(str(home), windows[1].key, **settings)
        assert run.returncode == 0, run.stderr[-3000:]
        assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(1, 2))
    once = read_rows(windows_path, ALL_COLUMNS)

    backfills = []
    for _ in range(2):
        run = dagster_materialize(str(home), f"{windows[0].key}...{windows[4].key}", **settings)
        assert run.returncode == 0, run.stderr[-3000:]
        backfills.append(read_rows(windows_path, ALL_COLUMNS))

    assert backfills[0] == backfills[1]
    assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(5))
    assert [r for r in backfills[0] if r in once] == once  # window 1 kept its pinned pane


@pytest.mark.parametrize("crash_at", ["window.after_close", "window.after_merge"])
def test_window_crash_then_rerun_gives_the_same_result(
    ingested, spark: SparkSession, home: Path, crash_at: str
) -> None:
    pipeline, lake, base, on_time, windows, closed = ingested
    windows_path = lake.table_path(pipeline.windows_table)
    settings = {"events_source": "files", "events_dir": str(Path(pipeline.source.directory))}

    crashed = dagster_materialize(str(home), windows[0].key, crash_at, **settings)
    assert f"crash injected at {crash_at}" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    closes = CloseStore(lake.checkpoints(), pipeline.window_asset)
    first_close = closes.latest(windows[0])
    assert first_close is not None and first_close.pane == 1  # the close was recorded before the crash

    rerun = dagster_materialize(str(home), windows[0].key, **settings)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(1))
    assert closes.latest(windows[0]) == first_close  # closed once, at one raw version
    assert {r[-1] for r in read_rows(windows_path, ALL_COLUMNS)} == {first_close.raw_version}
    # An in-process recompute agrees with what the Dagster runs left behind.
    before = read_rows(windows_path, ALL_COLUMNS)
    watermark = first_close.watermark_ms
    materialize_windows(
        spark, pipeline, [windows[0]], watermark, closes, lake.table_path(pipeline.raw_table), windows_path
    )
    assert read_rows(windows_path, ALL_COLUMNS) == before
