"""Record IDs held twice in raw: a window run's check looks at its windows' time buckets only, a cost that stays
flat as the table grows; the daily `maintain_tables` job audits the whole dedup horizon and fails naming the
pipeline."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.checks import duplicate_record_ids
from onceflow.jobs.windows.panes import Window
from onceflow.orchestration.definitions import definitions
from onceflow.orchestration.workload import Event
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings
from tests.pipelines import drain
from tests.test_windows import file_pipeline, write_events

HOUR = 3_600_000


def _copies(raw: pa.Table, event_id: str, moved_ms: int = 0) -> pa.Table:
    """A copy of the raw row of `event_id`, its event time (and time bucket) moved by `moved_ms`."""
    row = raw.filter(pc.equal(raw["record_id"], event_id))
    assert row.num_rows == 1
    times = pc.add(row["event_time"].cast(pa.int64()), moved_ms * 1000).cast(row.schema.field("event_time").type)
    row = row.set_column(row.schema.get_field_index("event_time"), "event_time", times)
    buckets = pc.add(row["time_bucket"], moved_ms // HOUR)
    return row.set_column(row.schema.get_field_index("time_bucket"), "time_bucket", buckets)


def test_a_window_run_counts_its_buckets_repeats_and_the_daily_audit_the_whole_horizon(
    spark: SparkSession, tmp_path: Path, home: Path
) -> None:
    pipeline = file_pipeline(tmp_path / "in")
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    base = (int(time.time() * 1000) - 4 * HOUR) // HOUR * HOUR
    # Three hours of events (three hourly time buckets), then one in the fourth hour for the watermark.
    events = [Event(f"h{h}-{i}", base + h * HOUR + i * 1000, f"k{i % 3}", i) for h in range(3) for i in range(10)]
    write_events(tmp_path / "in" / "1.jsonl", [*events, Event("last", base + 3 * HOUR + 30 * 60_000, "k0", 0)])
    drain(lambda: spark, source)
    watermark = source_watermark_ms(source.checkpoints.load())
    horizon = pipeline.dedup_horizon_s
    hours = [[Window(base + h * HOUR + m * 60_000, base + h * HOUR + (m + 1) * 60_000) for m in (0, 5)] for h in range(4)]
    assert [duplicate_record_ids(spark, source.raw_path, horizon, watermark, w) for w in hours] == [0, 0, 0, 0]

    # What a dedup failure would leave: a record twice in hour 0, and a record of hour 1 again in hour 2.
    raw = DeltaTable(source.raw_path).to_pyarrow_table()
    write_deltalake(source.raw_path, pa.concat_tables([_copies(raw, "h0-3"), _copies(raw, "h1-4", HOUR)]),
                    mode="append")

    # Each window run sees the repeats of its own buckets: hour 0's; the pair across hours 1 and 2 is no bucket's.
    assert [duplicate_record_ids(spark, source.raw_path, horizon, watermark, w) for w in hours] == [1, 0, 0, 0]
    assert duplicate_record_ids(spark, source.raw_path, horizon, watermark, hours[0] + hours[2]) == 2
    assert duplicate_record_ids(spark, source.raw_path, horizon, watermark, []) == 0
    assert duplicate_record_ids(spark, source.raw_path, horizon, watermark) == 2

    # The daily maintenance audits the whole horizon: its run fails naming the pipeline and both repeats.
    job = definitions([pipeline], load_settings()).resolve_job_def("maintain_tables")
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error.cause
    assert error.cls_name == "DuplicateRecordIds"
    assert "exactly-once raw tables: events: 2 (" in error.message, error.message
