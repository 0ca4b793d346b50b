"""Refires under `late_policy="refire"` (`onceflow.orchestration.sensors.refire`): late rows in more closed windows
than one tick may ask for are all refired across ticks, a stray old record asks for its own window alone, and
`onceflow verify` fails a window holding late rows without a newer pane. Batches ingested for real (files); the
sensor evaluated on a real instance."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sinks import output_sinks, publish_closed
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.panes import CloseStore, PaneClose, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.cli.verify import verify
from onceflow.orchestration.sensors.window import MAX_REQUESTS, build_window_sensor
from onceflow.orchestration.workload import Event
from onceflow.resources.lake import LakeResource
from tests.pipelines import drain
from tests.test_sensors import evaluate, launch
from tests.test_windows import file_pipeline, write_events

WINDOWS = MAX_REQUESTS + 10


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def base_ms() -> int:
    return (int(time.time() * 1000) - 6 * 3_600_000) // 60_000 * 60_000


def test_late_rows_in_more_windows_than_a_tick_asks_for_are_all_refired_and_a_stray_asks_for_one(
    spark: SparkSession, tmp_path: Path, home: Path, instance: dg.DagsterInstance
) -> None:
    base, lake = base_ms(), LakeResource(home=str(home))
    pipeline = file_pipeline(tmp_path / "in", late_policy="refire")
    source, output = open_source(pipeline, lake), pipeline.outputs[0]
    windows = [Window(base + i * 60_000, base + (i + 1) * 60_000) for i in range(WINDOWS)]
    write_events(tmp_path / "in" / "1.jsonl", [Event(f"on{i}", w.start_ms + 1_000, "k", 1) for i, w in enumerate(windows)])
    drain(lambda: spark, source)
    closes = CloseStore(lake.panes(), output.asset)
    for window in windows:  # every window's final pane closed after batch 1
        closes.close(window, PaneClose(window_start_ms=window.start_ms, pane=1, timing="on_time", raw_version=1,
                                       max_batch_id=1, watermark_ms=window.end_ms, closed_at_ms=window.end_ms))
    cursor = json.dumps({"first_window_ms": base, "next_window_ms": windows[-1].end_ms, "seen_batch": 1,
                         "pending": {}})
    # Batch 2 brings a late row to every window; more than a tick asks for.
    write_events(tmp_path / "in" / "2.jsonl", [Event(f"late{i}", w.start_ms + 2_000, "k", 1) for i, w in enumerate(windows)])
    drain(lambda: spark, source)
    sensor, asked = build_window_sensor(pipeline, output), []
    for _ in range(3):
        result = evaluate(sensor, instance, lake, cursor)
        asked += [r.partition_key for r in result.run_requests]
        launch(instance, result.run_requests, dg.DagsterRunStatus.SUCCESS)
        cursor = result.cursor
    assert sorted(asked) == sorted(w.key for w in windows)  # each once, none lost to the cap
    assert json.loads(cursor)["refire_queue"] == []

    # One stray old record, in window 5 alone: only that window is asked for.
    write_events(tmp_path / "in" / "3.jsonl", [Event("stray", windows[5].start_ms + 3_000, "k", 1)])
    drain(lambda: spark, source)
    result = evaluate(sensor, instance, lake, cursor)
    assert [r.run_key for r in result.run_requests] == [f"{output.asset}:{windows[5].key}:pane-2:2"]


def test_verify_fails_a_window_holding_late_rows_under_refire_without_a_newer_pane(
    spark: SparkSession, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, lake = base_ms(), LakeResource(home=str(home))
    pipeline: Pipeline = file_pipeline(tmp_path / "in", late_policy="refire")
    source, output = open_source(pipeline, lake), pipeline.outputs[0]
    window = Window(base, base + 60_000)
    write_events(tmp_path / "in" / "1.jsonl", [Event(f"on{i}", base + i * 1_000, "k", 1) for i in range(5)]
                 + [Event("closer", base + 10 * 60_000, "k", 1)])
    drain(lambda: spark, source)

    def materialize_and_publish() -> None:
        table = lake.table_path(output.table)
        results = materialize_windows(spark, pipeline, output, [window], base + 9 * 60_000,
                                      CloseStore(lake.panes(), output.asset), source.raw_path, table)
        sinks = output_sinks(output, lake.sink_root(), lake.staging_root(), None)
        publish_closed(spark, CommitContext(CommitStore(lake.commits())), output, sinks, table, results, "r", "r")

    materialize_and_publish()
    assert verify(spark, [pipeline], lake), capsys.readouterr().out
    write_events(tmp_path / "in" / "2.jsonl", [Event("late0", base + 30_000, "k", 1)])
    drain(lambda: spark, source)
    assert not verify(spark, [pipeline], lake)  # its refire is owed
    assert f"MISMATCH in {window.key}" in capsys.readouterr().out
    materialize_and_publish()  # the refire: pane 2 holds the late row
    assert verify(spark, [pipeline], lake), capsys.readouterr().out
