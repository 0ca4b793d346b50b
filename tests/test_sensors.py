"""The micro-batch and window sensors' decisions, evaluated against a real (temporary) Dagster instance.

The end-to-end test runs them under a real daemon; these pin down their run keys, cursors and in-flight rules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.ingest_job import source_tag
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.pane_sequence import publish_pane
from onceflow.jobs.run_relay import RELAY_TAG, UNTIL_TAG, plan_end
from onceflow.jobs.run_worker import worker_tags
from onceflow.jobs.sources.checkpoint import SourceCheckpoint
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.panes import CloseStore, PaneClose, Window
from onceflow.orchestration.deployments import LAKE, PUBSUB
from onceflow.orchestration.sensors.micro_batch import BATCH_TAG, active, build_micro_batch_sensor
from onceflow.orchestration.sensors.runs import build_dead_run_sensor, in_flight
from onceflow.orchestration.sensors.window import build_window_sensor
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource
from tests.pipelines import builtin

BASE = 1_795_000_000_000 // 60_000 * 60_000  # a minute boundary


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(tmp_path / "in"))
    monkeypatch.setenv("ONCEFLOW_LATE_POLICY", "refire")
    (tmp_path / "in").mkdir()
    return builtin("events")


def evaluate(
    sensor: dg.SensorDefinition, instance: dg.DagsterInstance, lake: LakeResource, cursor: str | None,
    pubsub: PubSubResource | None = None,
):
    resources = {LAKE: lake, PUBSUB: pubsub or PubSubResource(project="unused")}
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return sensor(context)


def test_micro_batch_sensor_requests_the_next_batch_one_at_a_time(
    tmp_path: Path, instance: dg.DagsterInstance, pipeline: Pipeline
) -> None:
    lake = LakeResource(home=str(tmp_path / "home"))
    sensor = build_micro_batch_sensor(pipeline, idle_tick_s=15)
    assert isinstance(evaluate(sensor, instance, lake, None), dg.SkipReason)  # no data, no open window

    (tmp_path / "in" / "a.jsonl").write_text('{"event_id": "1", "event_time": 1, "key": "k", "value": 1}\n')
    result = evaluate(sensor, instance, lake, None)
    [request] = result.run_requests
    assert request.run_key == "events:batch:1" and request.tags[BATCH_TAG] == "1"
    assert json.loads(result.cursor)["batch"] == 1

    run = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.STARTED,
                              tags=request.tags)
    skipped = evaluate(sensor, instance, lake, result.cursor)
    assert isinstance(skipped, dg.SkipReason) and "in flight" in (skipped.skip_message or "")

    # The run ended without committing batch 1: its key is used up, so the next request for batch 1 differs.
    instance.report_run_failed(run)
    again = evaluate(sensor, instance, lake, result.cursor)
    assert [r.run_key for r in again.run_requests] == ["events:batch:1:2"]

    # Once batch 1 is committed the sensor moves on to batch 2; the cursor never goes back.
    checkpoints = open_source(pipeline, lake).checkpoints
    checkpoints.update(lambda _: SourceCheckpoint(committed_batch=1, taken_files=[]))
    (tmp_path / "in" / "b.jsonl").write_text('{"event_id": "2", "event_time": 1, "key": "k", "value": 1}\n')
    later = evaluate(sensor, instance, lake, again.cursor)
    assert [r.run_key for r in later.run_requests] == ["events:batch:2"]
    assert json.loads(later.cursor)["batch"] == 2


def test_micro_batch_sensor_relays_an_active_worker_run_shortly_before_its_planned_end(
    tmp_path: Path, instance: dg.DagsterInstance, pipeline: Pipeline
) -> None:
    lake = LakeResource(home=str(tmp_path / "home"))
    sensor = build_micro_batch_sensor(pipeline, idle_tick_s=15, run_s=60)
    worker = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.STARTED,
                                 tags=source_tag(pipeline))
    instance.add_run_tags(worker.run_id, worker_tags(worker.run_id, os.getpid()))
    until = plan_end(instance, worker.run_id, 60)
    assert isinstance(evaluate(sensor, instance, lake, None), dg.SkipReason)  # 60 s before its end

    instance.add_run_tags(worker.run_id, {UNTIL_TAG: f"{until - 45_000}@{worker.run_id}"})  # 15 s before its end
    assert isinstance(evaluate(sensor, instance, lake, None), dg.SkipReason)  # the source idle: let it end

    instance.report_runless_asset_event(dg.AssetMaterialization("raw_events"))  # it committed a batch
    [request] = evaluate(sensor, instance, lake, None).run_requests
    assert request.run_key == f"events:relay:{worker.run_id}" and request.tags[RELAY_TAG] == worker.run_id
    create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.NOT_STARTED,
                        tags=request.tags)
    assert isinstance(evaluate(sensor, instance, lake, None), dg.SkipReason)  # its successor is on its way
    # Without worker runs (run_s 0) nothing is relayed.
    assert isinstance(evaluate(build_micro_batch_sensor(pipeline, 15), instance, lake, None), dg.SkipReason)
    # Active: a batch within the keep-warm time (ONCEFLOW_KEEP_WARM_S), or a window waiting for its watermark.
    time.sleep(1.1)
    checkpoint = SourceCheckpoint()
    assert not active(instance, pipeline, checkpoint, within_s=1) and active(instance, pipeline, checkpoint, 60)
    checkpoint = SourceCheckpoint(max_event_time_ms=BASE, watermark={"watermark_ms": BASE})
    assert active(instance, pipeline, checkpoint, within_s=1)


def test_window_sensor_requests_closed_windows_in_order_then_refires_late_ones(
    tmp_path: Path, instance: dg.DagsterInstance, pipeline: Pipeline
) -> None:
    lake = LakeResource(home=str(tmp_path / "home"))
    sensor = build_window_sensor(pipeline, pipeline.outputs[0])
    assert isinstance(evaluate(sensor, instance, lake, None), dg.SkipReason)  # no watermark yet

    checkpoints = open_source(pipeline, lake).checkpoints
    windows = [Window(BASE + i * 60_000, BASE + (i + 1) * 60_000) for i in range(4)]
    checkpoint = SourceCheckpoint(
        committed_batch=3, min_event_time_ms=BASE + 5_000, max_event_time_ms=BASE + 190_000,
        watermark={"watermark_ms": BASE + 151_000}, recent_batches=[(3, BASE + 5_000)],
    )
    checkpoints.update(lambda _: checkpoint)
    # Windows 0 and 1 ended 30 s (the allowed lateness) or more before the watermark; window 2 has not.
    result = evaluate(sensor, instance, lake, None)
    assert [(r.run_key, r.partition_key) for r in result.run_requests] == [
        (f"event_counts:{w.key}:final", w.key) for w in windows[:2]
    ]
    finals = launch(instance, result.run_requests)
    assert evaluate(sensor, instance, lake, result.cursor).run_requests == []  # in flight: nothing new

    # Window 0's final pane committed, its run over; a new batch holds an event of window 0: under `refire`
    # its next pane is requested.
    close_and_publish(lake, windows[0], pane=1)
    instance.report_run_failed(finals[0])  # died after its commit: the pane stands
    checkpoint.committed_batch = 4
    checkpoint.recent_batches.append((4, BASE + 30_000))
    checkpoints.update(lambda _: checkpoint)
    refired = evaluate(sensor, instance, lake, result.cursor)
    # Its own run key: the window has had a run (its final pane) before.
    assert [r.run_key for r in refired.run_requests] == [f"event_counts:{windows[0].key}:pane-2:2"]
    launch(instance, refired.run_requests)
    assert evaluate(sensor, instance, lake, refired.cursor).run_requests == []


def test_window_sensor_requests_a_final_pane_again_until_it_is_committed(
    tmp_path: Path, instance: dg.DagsterInstance, pipeline: Pipeline
) -> None:
    lake = LakeResource(home=str(tmp_path / "home"))
    sensor = build_window_sensor(pipeline, pipeline.outputs[0])
    window = Window(BASE, BASE + 60_000)
    open_source(pipeline, lake).checkpoints.update(lambda _: SourceCheckpoint(
        committed_batch=1, min_event_time_ms=BASE + 5_000, max_event_time_ms=BASE + 50_000,
        watermark={"watermark_ms": BASE + 100_000},
    ))
    first = evaluate(sensor, instance, lake, None)
    assert [r.run_key for r in first.run_requests] == [f"event_counts:{window.key}:final"]

    # Its run fails twice (it closed the window, then died before the final pane was committed): the cursor
    # has moved past the window, and still the sensor asks again, under a new run key each time.
    cursor = first.cursor
    close_pane(lake, window, pane=1)
    (run,) = launch(instance, first.run_requests)
    instance.report_run_failed(run)
    again = evaluate(sensor, instance, lake, cursor)
    assert [r.run_key for r in again.run_requests] == [f"event_counts:{window.key}:final:2"]
    (run,) = launch(instance, again.run_requests)
    instance.report_run_failed(run)
    third = evaluate(sensor, instance, lake, again.cursor)
    assert [r.run_key for r in third.run_requests] == [f"event_counts:{window.key}:final:3"]

    # Committed at last (the pane's publication written): nothing more is asked.
    launch(instance, third.run_requests)
    publish(lake, window, pane=1)
    done = evaluate(sensor, instance, lake, third.cursor)
    assert done.run_requests == [] and json.loads(done.cursor)["pending"] == {}


def test_window_sensor_asks_again_once_due_for_a_window_its_run_saw_still_open(
    tmp_path: Path, instance: dg.DagsterInstance, pipeline: Pipeline
) -> None:
    lake = LakeResource(home=str(tmp_path / "home"))
    sensor = build_window_sensor(pipeline, pipeline.outputs[0])
    window = Window(BASE, BASE + 60_000)
    checkpoints = open_source(pipeline, lake).checkpoints

    def watermark_at(ms: int) -> None:
        checkpoints.update(lambda _: SourceCheckpoint(
            committed_batch=1, min_event_time_ms=BASE + 5_000, max_event_time_ms=BASE + 50_000,
            watermark={"watermark_ms": ms}))

    watermark_at(BASE + 100_000)
    first = evaluate(sensor, instance, lake, None)
    assert [r.run_key for r in first.run_requests] == [f"event_counts:{window.key}:final"]
    # The checkpoint is restored from an older copy before the run reads it: the run finds the window open,
    # materializes a provisional pane and succeeds. Nothing is asked, and no attempt used, while it is not due.
    watermark_at(BASE + 70_000)
    launch(instance, first.run_requests, dg.DagsterRunStatus.SUCCESS)
    waiting = evaluate(sensor, instance, lake, first.cursor)
    assert waiting.run_requests == []
    assert json.loads(waiting.cursor)["pending"][window.key]["attempts"] == 1
    watermark_at(BASE + 100_000)  # realigned: due again
    again = evaluate(sensor, instance, lake, waiting.cursor)
    assert [r.run_key for r in again.run_requests] == [f"event_counts:{window.key}:final:2"]
    assert json.loads(again.cursor)["pending"][window.key]["attempts"] == 2


def test_window_sensor_tracks_a_refire_until_its_run_succeeds_and_refires_late_rows_of_a_pending_window(
    tmp_path: Path, instance: dg.DagsterInstance, pipeline: Pipeline
) -> None:
    lake = LakeResource(home=str(tmp_path / "home"))
    sensor = build_window_sensor(pipeline, pipeline.outputs[0])
    window = Window(BASE, BASE + 60_000)
    checkpoints = open_source(pipeline, lake).checkpoints
    checkpoint = SourceCheckpoint(committed_batch=1, min_event_time_ms=BASE + 5_000, max_event_time_ms=BASE + 50_000,
                                  watermark={"watermark_ms": BASE + 100_000}, recent_batches=[(1, BASE + 5_000)])
    checkpoints.update(lambda _: checkpoint)
    first = evaluate(sensor, instance, lake, None)
    (final,) = launch(instance, first.run_requests)
    # Late rows come in batch 2 while the final pane's run is running: it may have read raw before them.
    checkpoint.committed_batch = 2
    checkpoint.recent_batches.append((2, BASE + 7_000))
    checkpoints.update(lambda _: checkpoint)
    during = evaluate(sensor, instance, lake, first.cursor)
    assert during.run_requests == [] and json.loads(during.cursor)["pending"][window.key]["again"] is True
    close_and_publish(lake, window, pane=1)
    instance.report_run_failed(final)  # committed, then died: the pane stands, the late rows get the next one
    after = evaluate(sensor, instance, lake, during.cursor)
    assert [r.run_key for r in after.run_requests] == [f"event_counts:{window.key}:pane-2:2"]

    # That refire's run dies before closing pane 2: it is asked for again; once a run of it succeeds, done.
    (refire,) = launch(instance, after.run_requests)
    instance.report_run_failed(refire)
    retried = evaluate(sensor, instance, lake, after.cursor)
    assert [r.run_key for r in retried.run_requests] == [f"event_counts:{window.key}:pane-2:3"]
    launch(instance, retried.run_requests, dg.DagsterRunStatus.SUCCESS)
    done = evaluate(sensor, instance, lake, retried.cursor)
    assert done.run_requests == [] and json.loads(done.cursor)["pending"] == {}


def test_window_sensor_closes_windows_older_than_the_first_it_looked_at(
    tmp_path: Path, instance: dg.DagsterInstance, pipeline: Pipeline
) -> None:
    lake = LakeResource(home=str(tmp_path / "home"))
    sensor = build_window_sensor(pipeline, pipeline.outputs[0])
    windows = [Window(BASE + i * 60_000, BASE + (i + 1) * 60_000) for i in range(4)]
    checkpoints = open_source(pipeline, lake).checkpoints

    def seen(min_window: int, watermark_ms: int) -> None:
        checkpoints.update(lambda _: SourceCheckpoint(
            committed_batch=1, min_event_time_ms=windows[min_window].start_ms + 1_000,
            max_event_time_ms=windows[3].start_ms + 1_000, watermark={"watermark_ms": watermark_ms}))

    # The first batch held window 2's rows only; the next, from a partition behind the others, window 1's.
    seen(2, BASE)
    first = evaluate(sensor, instance, lake, None)
    assert first.run_requests == []
    seen(1, windows[2].end_ms + 30_000)
    due = evaluate(sensor, instance, lake, first.cursor)
    assert [r.partition_key for r in due.run_requests] == [windows[1].key, windows[2].key]
    launch(instance, due.run_requests)
    # Window 2 was asked for when rows of window 0 come: window 0 is due as well, and asked for at once.
    seen(0, windows[2].end_ms + 30_000)
    older = evaluate(sensor, instance, lake, due.cursor)
    assert [r.run_key for r in older.run_requests] == [f"event_counts:{windows[0].key}:final"]
    assert set(json.loads(older.cursor)["pending"]) == {w.key for w in windows[:3]}


def close_and_publish(lake: LakeResource, window: Window, pane: int) -> None:
    close_pane(lake, window, pane)
    publish(lake, window, pane)


def close_pane(lake: LakeResource, window: Window, pane: int) -> None:
    CloseStore(lake.panes(), "event_counts").close(window, PaneClose(
        window_start_ms=window.start_ms, pane=pane, timing="on_time", raw_version=3, max_batch_id=1,
        watermark_ms=window.end_ms, closed_at_ms=window.end_ms))


def publish(lake: LakeResource, window: Window, pane: int) -> None:
    """The pane's publication written ahead: the last step of its run."""
    publish_pane(CommitStore(lake.commits()), asset="event_counts", window=window, pane=pane, rows=[],
                 schema=[("window_start", "TIMESTAMP"), ("pane", "INT64")], sink_root=None)


def launch(
    instance: dg.DagsterInstance, requests: list[dg.RunRequest], status: dg.DagsterRunStatus = dg.DagsterRunStatus.STARTED,
) -> list[dg.DagsterRun]:
    """Runs for `requests`, started as the daemon would start them (their tags include the partition)."""
    return [
        create_run_for_test(
            instance, job_name="__ASSET_JOB", status=status,
            tags={**r.tags, "dagster/partition": r.partition_key or "", "dagster/run_key": r.run_key or ""},
        )
        for r in requests
    ]


def test_a_run_whose_process_is_gone_is_reported_failed_and_not_in_flight(instance: dg.DagsterInstance) -> None:
    # A run marked started by a process that was then killed without reporting (a `dagster job execute` killed).
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.STARTED)
    instance.add_run_tags(dead.run_id, worker_tags(dead.run_id, worker.pid))
    alive = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.STARTED)
    instance.add_run_tags(alive.run_id, worker_tags(alive.run_id, os.getpid()))
    # Dagster's automatic retry of the dead run carries its tags, pid included, until its own worker starts.
    retry = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.STARTING,
                                tags=worker_tags(dead.run_id, worker.pid))
    dead = instance.get_run_by_id(dead.run_id)
    assert in_flight(instance, [dead]) is not None  # its process still runs
    worker.kill()
    worker.wait()

    assert in_flight(instance, [dead]) is None
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
    assert "is gone" in str([e.message for e in instance.all_logs(dead.run_id)])
    skipped = build_dead_run_sensor()(dg.build_sensor_context(instance=instance))
    assert "no dead runs" in skipped.skip_message  # the live one stays, and so does the retry
    assert instance.get_run_by_id(alive.run_id).status == dg.DagsterRunStatus.STARTED
    assert instance.get_run_by_id(retry.run_id).status == dg.DagsterRunStatus.STARTING
    assert in_flight(instance, [instance.get_run_by_id(retry.run_id)]) is not None
