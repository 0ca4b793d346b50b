"""Records before a pipeline's `start_date` (inside the dedup horizon) are valid raw rows without a window: the
window sensor never asks for a partition before the first, and the first window's metadata counts them."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
from pyspark.sql import SparkSession

from onceflow.assets.window_asset import window_metadata, window_partitions
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.sensors.window import build_window_sensor
from onceflow.orchestration.workload import Event
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import drain
from tests.test_sensors import evaluate
from tests.test_windows import file_pipeline, write_events


def test_records_before_the_start_date_request_no_partition_and_are_counted(
    spark: SparkSession, tmp_path: Path, home: Path
) -> None:
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    midnight = int(datetime.strptime(today, "%Y-%m-%d").replace(tzinfo=UTC).timestamp() * 1000)
    if time.time() * 1000 - midnight < 10 * 60_000:
        midnight -= 86_400_000  # just after midnight: yesterday's start keeps the test's windows in the past
        today = datetime.fromtimestamp(midnight / 1000, UTC).strftime("%Y-%m-%d")
    pipeline = dataclasses.replace(file_pipeline(tmp_path / "in"), start_date=today)
    output = pipeline.outputs[0]
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    before = [Event("early-1", midnight - 5 * 60_000, "k0", 1), Event("early-2", midnight - 60_000, "k1", 2)]
    first = [Event(f"first-{i}", midnight + i * 10_000, "k0", i) for i in range(3)]
    write_events(tmp_path / "in" / "1.jsonl", [*before, *first, Event("later", midnight + 5 * 60_000, "k0", 1)])
    drain(lambda: spark, source)
    assert len(read_rows(source.raw_path, ["record_id"])) == 6  # the early records are valid raw rows
    # The watermark has passed the first window (and its allowed lateness) only.
    source.checkpoints.update(lambda c: c.model_copy(update={"watermark": {**c.watermark, "watermark_ms": midnight + 100_000}}))
    window = Window(midnight, midnight + 60_000)

    with dg.instance_for_test() as instance:
        result = evaluate(build_window_sensor(pipeline, output), instance, lake, None)
    assert [(r.run_key, r.partition_key) for r in result.run_requests] == [(f"event_counts:{window.key}:final",
                                                                            window.key)]
    assert window_partitions(pipeline, output).get_first_partition_key() == window.key

    (materialized,) = materialize_windows(spark, pipeline, output, [window], midnight + 100_000, CloseStore(
        lake.panes(), output.asset), source.raw_path, lake.table_path(output.table))
    metadata = window_metadata(materialized, "done")
    assert (metadata["records"], metadata["records_before_first_window"]) == (3, 2)
    (later,) = materialize_windows(spark, pipeline, output, [window.next()], None, CloseStore(
        lake.panes(), output.asset), source.raw_path, lake.table_path(output.table))
    assert "records_before_first_window" not in window_metadata(later, "not closed")
