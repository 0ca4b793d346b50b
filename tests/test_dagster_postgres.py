"""The daemon end to end with Dagster on a real PostgreSQL: `local_stack(dagster_storage="postgres")` runs the
production `dagster.yaml` (deploy/dagster.prod.yaml) on a server the stack starts; the daemon's sensors launch the
micro-batch runs through the queued run coordinator, the raw table holds exactly the published events (read back
with delta-rs), and the runs, their events and the sensors' ticks are in PostgreSQL itself (queried there)."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

import dagster as dg
import pytest

from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.deployments import LAKE, PUBSUB, resources_for
from onceflow.orchestration.local_stack import LocalStack, local_stack
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.workload import (
    Event,
    expected_raw,
    make_events,
    publish_events,
    with_publisher_retries,
)
from onceflow.resources.settings import load_settings
from onceflow.resources.spark_connect import SparkConnectServer
from tests.conftest import require
from tests.delta_reader import read_rows
from tests.postgres import query, require_postgres

RAW = ["record_id", "event_time", "key", "value"]
SETTINGS = {
    "ONCEFLOW_PUBSUB_PROJECT": "onceflow-pg",
    "ONCEFLOW_MAX_MESSAGES": "500",
    "ONCEFLOW_MAX_SECONDS": "1",
    "ONCEFLOW_ACK_DEADLINE_S": "30",
    "ONCEFLOW_IDLE_TICK_S": "3600",  # runs only for new data: idle runs would only load the machine
}
MATERIALIZATIONS = """SELECT count(*) FROM event_logs e JOIN runs r ON r.run_id = e.run_id
    WHERE r.pipeline_name = 'ingest_events' AND e.dagster_event_type = 'ASSET_MATERIALIZATION'"""


def wait_for_rows(stack: LocalStack, raw_path: str, events: list[Event], timeout_s: float = 300.0) -> None:
    """Until the raw table holds as many rows as `events` has IDs and its batch's run has recorded it."""
    expected = expected_raw(events)
    started, deadline = time.monotonic(), time.monotonic() + timeout_s
    rows: list[tuple] = []
    while time.monotonic() < deadline:
        assert stack.daemon.poll() is None, f"dagster-daemon exited:\n{stack.daemon_log()}"
        if os.path.exists(os.path.join(raw_path, "_delta_log")):
            rows = read_rows(raw_path, RAW)
            if len(rows) >= len(expected) and not in_flight(stack):
                break
        time.sleep(1)
    print(f"{len(rows)} rows after {time.monotonic() - started:.0f} s", flush=True)
    assert rows == expected, f"{len(rows)} of {len(expected)} rows\n{stack.daemon_log()}"


def in_flight(stack: LocalStack) -> bool:
    return any(not run.is_finished for run in stack.instance.get_runs(filters=dg.RunsFilter(job_name="ingest_events")))


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_the_daemon_runs_the_micro_batches_on_postgres(spark_connect: SparkConnectServer) -> None:
    require(shutil.which("gcloud") is not None, "the Google Cloud CLI's Pub/Sub emulator")
    require_postgres()
    with local_stack(SETTINGS, "onceflow-pg-", spark_remote=spark_connect.url, dagster_storage="postgres") as stack:
        assert stack.postgres is not None
        assert type(stack.instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(stack.instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        settings = load_settings()
        pipeline = next(p for p in load_pipelines(settings) if p.name == "events")
        resources = resources_for(settings)
        client = resources[PUBSUB].client()
        source = open_source(pipeline, resources[LAKE], lambda: client)
        start_ms = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000  # within the dedup horizon
        first, second = make_events(40, start_ms, 120_000), make_events(30, start_ms, 120_000, prefix="f")
        publish_events(client, pipeline.source.topic, with_publisher_retries(first, 0.2))
        wait_for_rows(stack, source.raw_path, first)
        publish_events(client, pipeline.source.topic, with_publisher_retries(second, 0.2, seed=5))
        wait_for_rows(stack, source.raw_path, first + second)

        committed = source.checkpoints.load().committed_batch
        assert committed >= 2
        runs = query(stack.postgres, "SELECT run_id, status FROM runs WHERE pipeline_name = 'ingest_events'")
        assert len([r for r in runs if r[1] == "SUCCESS"]) >= 2, runs
        assert query(stack.postgres, MATERIALIZATIONS) == [(committed,)]  # one per committed batch
        ticks = query(stack.postgres, "SELECT count(*) FROM job_ticks "
                      "WHERE CAST(tick_body AS json)->>'job_name' = 'events_micro_batch_sensor'")
        assert ticks[0][0] >= 2
        # One micro-batch run per source at a time (the sensor waits for the one in flight): no two overlapped.
        records = sorted(stack.instance.get_run_records(), key=lambda r: r.start_time or 0)
        spans = [(r.start_time, r.end_time) for r in records if r.dagster_run.job_name == "ingest_events"]
        assert all(end is not None for _, end in spans)
        assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), spans
        assert not list(Path(os.environ["DAGSTER_HOME"]).rglob("*.db"))  # nothing went to SQLite
