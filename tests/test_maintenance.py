"""Stable input has a shelf life: tables keep versions for the pipeline's retention, maintenance compacts and
vacuums without breaking a recompute within it, and a recompute beyond it fails saying why."""

from __future__ import annotations

import dataclasses
import json
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
    # Four hours of events, two batches an hour: several small data files per time bucket, worth compacting; the
    # first batch of each of two hours has a bad record too: a file each in the dead-letter table.
    for hour in range(4):
        for part in range(2):
            events = [Event(f"h{hour}-{part}-{i}", base + hour * HOUR + i * 6000, f"k{i % 3}", i) for i in range(20)]
            write_events(tmp_path / "in" / f"{hour}-{part}.jsonl", events)
            if part == 0 and hour < 2:
                bad_line(tmp_path / "in" / f"{hour}-{part}.jsonl", f"bad-{hour}", base + hour * HOUR)
            drain(lambda: spark, source)
    window, next_window = Window(base, base + 60_000), Window(base + 60_000, base + 120_000)
    closes = CloseStore(lake.panes(), output.asset)
    windows_path = lake.table_path(output.table)
    # A window step each: at least a file each in the window table (a MERGE writes a file per shuffle partition its
    # rows hash to, which depends on the window's start).
    for one in (window, next_window):
        materialize_windows(spark, pipeline, output, [one], one.end_ms + 30_000, closes, source.raw_path,
                            windows_path)
    pinned = read_rows(windows_path, [*WINDOW_ROWS, "raw_version"])
    assert {row[-1] for row in pinned} == {pinned[0][-1]}
    assert {int(row[0].timestamp() * 1000) for row in pinned} == {window.start_ms, next_window.start_ms}
    assert len(DeltaTable(windows_path).file_uris()) >= 2
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
    # So is the dead-letter table.
    assert len(DeltaTable(source.dead_letter_path).file_uris()) == 1
    assert sorted(read_rows(source.dead_letter_path, ["record_id"])) == [("bad-0",), ("bad-1",)]
    # The windows are recomputed from their pinned version, files removed by the compactions included: same rows.
    for one in (window, next_window):
        materialize_windows(spark, pipeline, output, [one], one.end_ms + 30_000, closes, source.raw_path,
                            windows_path)
    assert read_rows(windows_path, [*WINDOW_ROWS, "raw_version"]) == pinned
    assert read_rows(source.raw_path, ["record_id", "event_time"], version=pinned[0][-1]) == at_pinned
    # Ingest goes on after maintenance; a dead letter held before the compaction is held still.
    write_events(tmp_path / "in" / "later.jsonl", [Event("after", base + 3 * HOUR + 1, "k0", 1)])
    bad_line(tmp_path / "in" / "later.jsonl", "bad-1", base + HOUR)
    (result,) = drain(lambda: spark, source)
    assert (result.inserted, result.dead_lettered_new, result.dead_letter_duplicates) == (1, 0, 1)
    assert sorted(read_rows(source.dead_letter_path, ["record_id"])) == [("bad-0",), ("bad-1",)]


def bad_line(path: Path, record_id: str, event_time_ms: int) -> None:
    """Append to a batch's file a record whose `value` is not a number: a dead letter (`wrong_type`)."""
    with path.open("a") as out:
        out.write(json.dumps({"event_id": record_id, "event_time": event_time_ms, "key": "k0", "value": "x"}) + "\n")


def test_a_dead_letter_append_that_loses_to_a_compaction_is_decided_again(
    spark: SparkSession, tmp_path: Path, home: Path
) -> None:
    """The compaction of the dead-letter table commits between the moment its ID filters answered for a batch's
    dead letters and their append: the append fails, is decided again on the compacted version, and holds each
    dead letter once."""
    pipeline = file_pipeline(tmp_path / "in")
    source = open_source(pipeline, LakeResource(home=str(home)))
    base = (int(time.time() * 1000) - HOUR) // HOUR * HOUR
    for part in range(2):
        write_events(tmp_path / "in" / f"{part}.jsonl", [Event(f"e{part}", base + part, "k0", 1)])
        bad_line(tmp_path / "in" / f"{part}.jsonl", f"bad-{part}", base)
        drain(lambda: spark, source)
    assert len(DeltaTable(source.dead_letter_path).file_uris()) == 2
    store = source.dead_letter_filters
    assert store is not None
    loads = []

    def load_then_compact(floor_bucket: int | None):
        filters = type(store).load(store, floor_bucket)
        loads.append(filters.version)
        if len(loads) == 1:  # a commit the filters did not answer for: the compaction
            spark.sql(f"OPTIMIZE delta.`{source.dead_letter_path}`")
        return filters

    store.load = load_then_compact
    write_events(tmp_path / "in" / "2.jsonl", [Event("e2", base + 2, "k0", 1)])
    bad_line(tmp_path / "in" / "2.jsonl", "bad-0", base)  # held before the compaction
    bad_line(tmp_path / "in" / "2.jsonl", "bad-2", base)  # new
    (result,) = drain(lambda: spark, source)

    assert loads == [loads[0], loads[0] + 1]  # decided again on the compaction's version
    assert (result.inserted, result.dead_lettered_new, result.dead_letter_duplicates) == (1, 1, 1)
    assert sorted(read_rows(source.dead_letter_path, ["record_id"])) == [("bad-0",), ("bad-1",), ("bad-2",)]
    operations = [h["operation"] for h in spark.sql(f"DESCRIBE HISTORY delta.`{source.dead_letter_path}`").collect()]
    assert operations[:2] == ["WRITE", "OPTIMIZE"]


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


def test_tables_keep_versions_for_the_whole_retention_rounded_up_and_their_log_longer() -> None:
    from onceflow.jobs.delta.transactions import LOG_MARGIN_H, table_properties

    properties = table_properties(90 * 60)  # 90 minutes: kept 2 hours, never 1
    assert properties["delta.deletedFileRetentionDuration"] == "interval 2 hours"
    assert properties["delta.logRetentionDuration"] == f"interval {2 + LOG_MARGIN_H} hours"
