"""Stable input has a shelf life: tables keep versions for the pipeline's retention, maintenance compacts and
vacuums without breaking a recompute within it, and a recompute beyond it fails saying why."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.panes import CloseStore, PaneClose, Window
from onceflow.jobs.windows.pinned_input import PinnedInputExpired
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.workload import Event
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import dagster_cli, drain
from tests.test_windows import WINDOW_ROWS, file_pipeline, write_events

HOUR = 3_600_000


def test_maintenance_compacts_and_vacuums_without_breaking_a_recompute(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(tmp_path / "in"))
    monkeypatch.setenv("ONCEFLOW_DEDUP_HORIZON_S", "3600")
    pipeline = file_pipeline(tmp_path / "in")
    pipeline = dataclasses.replace(pipeline, dedup_horizon="1h")
    output = pipeline.outputs[0]
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    base = (int(time.time() * 1000) - 5 * HOUR) // HOUR * HOUR
    # Four hours of events, two batches an hour: several small data files per time bucket, worth compacting.
    for hour in range(4):
        for part in range(2):
            events = [Event(f"h{hour}-{part}-{i}", base + hour * HOUR + i * 1000, f"k{i % 3}", i) for i in range(20)]
            write_events(tmp_path / "in" / f"{hour}-{part}.jsonl", events)
            drain(lambda: spark, source)
    window, next_window = Window(base, base + 60_000), Window(base + 60_000, base + 120_000)
    closes = CloseStore(lake.panes(), output.asset)
    windows_path = lake.table_path(output.table)
    for one in (window, next_window):  # a window step each: a file each in the window table
        materialize_windows(spark, pipeline, output, [one], one.end_ms + 30_000, closes, source.raw_path,
                            windows_path)
    pinned = read_rows(windows_path, [*WINDOW_ROWS, "raw_version"])
    assert {row[-1] for row in pinned} == {pinned[0][-1]} and len(DeltaTable(windows_path).file_uris()) == 2
    at_pinned = read_rows(source.raw_path, ["record_id", "event_time"], version=pinned[0][-1])
    raw = DeltaTable(source.raw_path)
    assert raw.metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 720 hours"
    files_before = len(raw.file_uris())

    run = dagster_cli(["job", "execute", "-m", "onceflow.orchestration.definitions", "-j", "maintain_tables"], str(home), None)
    assert run.returncode == 0, run.stderr[-3000:]

    history = spark.sql(f"DESCRIBE HISTORY delta.`{source.raw_path}`").collect()
    optimize = [h for h in history if h["operation"] == "OPTIMIZE"]
    assert optimize and "time_bucket" in optimize[0]["operationParameters"]["predicate"]
    assert len(DeltaTable(source.raw_path).file_uris()) < files_before
    # The window table is compacted whole: its window steps' files are one.
    assert len(DeltaTable(windows_path).file_uris()) == 1
    assert [h["operation"] for h in spark.sql(f"DESCRIBE HISTORY delta.`{windows_path}`").collect()][:3] == [
        "VACUUM END", "VACUUM START", "OPTIMIZE"]
    # The windows are recomputed from their pinned version, files removed by the compactions included: same rows.
    for one in (window, next_window):
        materialize_windows(spark, pipeline, output, [one], one.end_ms + 30_000, closes, source.raw_path,
                            windows_path)
    assert read_rows(windows_path, [*WINDOW_ROWS, "raw_version"]) == pinned
    assert read_rows(source.raw_path, ["record_id", "event_time"], version=pinned[0][-1]) == at_pinned
    # Ingest goes on after maintenance.
    write_events(tmp_path / "in" / "later.jsonl", [Event("after", base + 3 * HOUR + 1, "k0", 1)])
    (result,) = drain(lambda: spark, source)
    assert result.inserted == 1


def test_a_recompute_beyond_retention_fails_saying_why(spark: SparkSession, tmp_path: Path, home: Path) -> None:
    pipeline = file_pipeline(tmp_path / "in")
    output = pipeline.outputs[0]
    lake = LakeResource(home=str(home))
    base = (int(time.time() * 1000) - 40 * 24 * HOUR) // 60_000 * 60_000
    window = Window(base, base + 60_000)
    closes = CloseStore(lake.panes(), output.asset)
    closes.close(window, PaneClose(window_start_ms=window.start_ms, pane=1, timing="on_time", raw_version=3,
                                   max_batch_id=2, watermark_ms=window.end_ms, closed_at_ms=window.end_ms + 40_000))

    with pytest.raises(PinnedInputExpired, match=rf"event_counts window {window.key} pane 1 was closed at raw "
                                                 r"version 3 on .*; the tables keep versions for 720 hours"):
        materialize_windows(spark, pipeline, output, [window], None, closes, lake.table_path(pipeline.raw_table),
                            lake.table_path(output.table))
