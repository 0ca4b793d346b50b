"""Batch numbers go on across a reset's epochs: late records of a new epoch are late against windows an old epoch
closed, they refire those windows, and the checks, the window sensor and `onceflow verify` hold across epochs."""

from __future__ import annotations

import argparse
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sinks import output_sinks, publish_closed
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.checkpoint import EpochSealed
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.checks import duplicate_record_ids, output_mismatches, unaccounted_late
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import WindowResult, materialize_windows
from onceflow.orchestration.cli.reset import cmd_reset
from onceflow.orchestration.cli.verify import verify
from onceflow.orchestration.sensors.window import build_window_sensor
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows, transaction_version
from tests.pipelines import drain
from tests.test_sensors import evaluate
from tests.test_windows import (
    LATENESS_MS,
    WINDOW_ROWS,
    expected_rows,
    file_pipeline,
    five_window_workload,
    minute_base,
    write_events,
)


def test_late_records_after_a_reset_refire_the_window_an_earlier_epoch_closed(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    incoming = tmp_path / "in"
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(incoming))
    monkeypatch.setenv("ONCEFLOW_LATE_POLICY", "refire")
    monkeypatch.setenv("ONCEFLOW_MAX_FILES", "1")
    base = minute_base()
    on_time, late, _ = five_window_workload(base)
    late = [e for e in late if e.event_time_ms < base + 60_000]  # 4 late records, all in window 0
    pipeline = file_pipeline(incoming, late_policy="refire")
    output = pipeline.outputs[0]
    lake = LakeResource(home=str(home))
    windows = [Window(base + w * 60_000, base + (w + 1) * 60_000) for w in range(3)]
    windows_path = lake.table_path(output.table)
    closes = CloseStore(lake.panes(), output.asset)
    sensor = build_window_sensor(pipeline, output)
    sinks = output_sinks(output, lake.sink_root(), lake.staging_root(), None)

    def materialize() -> list[WindowResult]:
        results = materialize_windows(spark, pipeline, output, windows[:2], windows[1].end_ms + LATENESS_MS, closes,
                                      lake.table_path(pipeline.raw_table), windows_path)
        publish_closed(spark, CommitContext(CommitStore(lake.commits())), output, sinks, windows_path, results,
                       "run", "run")
        return results

    # Epoch 0: three batches, one window each; windows 0 and 1 close after its batch 3.
    for w in range(3):
        write_events(incoming / f"b{w}.jsonl", [e for e in on_time if windows[w].start_ms <= e.event_time_ms
                                                 < windows[w].end_ms])
    old = open_source(pipeline, lake)
    assert [r.batch_id for r in drain(lambda: spark, old)] == [1, 2, 3]
    assert [(r.pane, closes.latest(r.window).max_batch_id) for r in materialize()] == [(1, 3), (1, 3)]
    with dg.instance_for_test() as instance:
        before = evaluate(sensor, instance, lake, None)
        watermark = source_watermark_ms(old.checkpoints.load())

        assert cmd_reset(argparse.Namespace(pipeline="events", drop_uncommitted=False)) == 0
        assert "epoch 1 started; its source now commits as events/files@1, from batch 4" in capsys.readouterr().out
        with pytest.raises(EpochSealed):
            drain(lambda: spark, old)  # a run of the old epoch can no longer plan a batch

        # Epoch 1 takes every file again; the late one sorts first, so it is the epoch's first batch.
        write_events(incoming / "a-late.jsonl", late)
        source = open_source(pipeline, lake)
        assert [r.batch_id for r in drain(lambda: spark, source)] == [4, 5, 6, 7]
        assert transaction_version(source.raw_path, "events/files") == 3
        assert transaction_version(source.raw_path, "events/files@1") == 7
        # The new epoch goes on from the old one's watermark: its first batch has a dedup horizon floor (its ID
        # filters are not rebuilt over the whole raw table).
        assert source.checkpoints.get_plan(4).horizon_floor_ms == watermark - pipeline.dedup_horizon_s * 1000

        # The window sensor's cursor, written in epoch 0, sees epoch 1's late batch.
        after = evaluate(sensor, instance, lake, before.cursor)
        assert f"event_counts:{windows[0].key}:pane-2" in [r.run_key for r in after.run_requests]

    results = materialize()
    assert [(r.pane, r.timing, r.records, r.late) for r in results] == [(2, "late", 16, 0), (1, "on_time", 12, 0)]
    assert read_rows(windows_path, WINDOW_ROWS) == sorted(
        expected_rows(base, on_time + late, range(1), 2, "late") + expected_rows(base, on_time, range(1, 2), 1, "on_time")
    )
    raw = lake.table_path(pipeline.raw_table)
    assert output_mismatches(spark, pipeline, output, raw, windows_path, results) == []
    assert unaccounted_late(spark, raw, results) == []
    assert duplicate_record_ids(spark, raw, pipeline.dedup_horizon_s, None) == 0

    # verify reconciles both epochs' landed records against the tables: window 0 received its 12 records twice
    # (epoch 1 took the files again) and the 4 late ones, which its pane 2 holds.
    assert verify(spark, [pipeline], lake)
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("20")}
    assert rows[windows[0].key] == [windows[0].key, "28", "16", "12", "0", "0", "3", "2", "yes", "ok"]
    assert rows[windows[1].key] == [windows[1].key, "24", "12", "12", "0", "0", "3", "1", "yes", "ok"]
