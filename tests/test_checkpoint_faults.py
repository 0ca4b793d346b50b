"""Checkpoints under overlapping faults: an overlapping run, a checkpoint lost or restored from an old copy, a
deliberate reset. The raw table, read with delta-rs, holds every record once whatever the checkpoint went
through."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.ingest import micro_batch
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.checkpoint import EpochStore
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.verify.landed import landed_records
from onceflow.jobs.verify.reconcile import reconcile_source
from onceflow.orchestration.sensors.micro_batch import build_micro_batch_sensor
from onceflow.orchestration.sensors.window import build_window_sensor
from onceflow.orchestration.workload import expected_raw, make_events, publish_events
from onceflow.resources.emulators.pubsub import PubSubEmulator
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource
from tests.delta_reader import read_rows, transaction_version
from tests.pipelines import (
    TOPIC,
    builtin,
    dagster_micro_batch,
    drain,
    events_from_files,
    events_pipeline,
    new_project,
    setup,
)
from tests.test_ingest_files import BAD_LINES, seed_files, write_jsonl
from tests.test_sensors import evaluate

RAW = ["record_id", "event_time", "key", "value"]
# An hour ago: inside the dedup horizon (1 d) below any watermark an idle source may reach meanwhile.
START_MS = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000


def test_an_idle_run_overlapping_a_commit_never_moves_the_checkpoint_back(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = tmp_path / "incoming"
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(incoming))
    write_jsonl(incoming / "1.jsonl", [e.json_line() for e in make_events(50, START_MS, 60_000, seed=1)])
    lake = LakeResource(home=str(home))
    first, second = open_source(builtin("events"), lake), open_source(builtin("events"), lake)
    drain(lambda: spark, first)
    before = first.checkpoints.load()

    # Run A finds nothing to do; while it is at it, run B commits a new file as batch 2. A then records its
    # (idle) watermark: it must not write back the checkpoint it loaded, from before batch 2.
    find_nothing = first.reader.next_plan

    def overlapped(checkpoint, floor, proposal=None):
        write_jsonl(incoming / "2.jsonl", [e.json_line() for e in make_events(30, START_MS, 60_000, 2, "b")])
        assert run_micro_batch(lambda: spark, second) is not None
        return find_nothing(checkpoint, floor) if checkpoint.next_batch > 2 else None

    monkeypatch.setattr(first.reader, "next_plan", overlapped)
    assert run_micro_batch(lambda: spark, first) is None

    after = first.checkpoints.load()
    assert before.committed_batch == 1 and after.committed_batch == 2
    assert after.totals["received"] == 80 and set(after.taken_files) == {"1.jsonl", "2.jsonl"}


def test_a_checkpoint_restored_from_an_old_copy_loses_nothing(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = events_pipeline(max_messages=100)
    client, source = setup(new_project(), str(home), pipeline)
    first, later = make_events(200, START_MS, 60_000, seed=3), make_events(150, START_MS, 60_000, seed=4, prefix="n")
    publish_events(client, TOPIC, first[:100])
    drain(lambda: spark, source)
    backup = tmp_path / "checkpoints-backup"
    publish_events(client, TOPIC, first[100:])
    source.reader.before_batch(int(time.time() * 1000))  # the tracking subscription shows batch 2's messages
    shutil.copytree(home / "checkpoints", backup)  # taken after batch 1, with batch 2's messages pending
    drain(lambda: spark, source)
    assert source.checkpoints.load().committed_batch == 2

    shutil.rmtree(home / "checkpoints")
    shutil.copytree(backup, home / "checkpoints")  # the old copy comes back; the lake has batch 2 already
    publish_events(client, TOPIC, later)
    results = drain(lambda: spark, open_source(pipeline, LakeResource(home=str(home)), lambda: client))

    # Fresh messages never land under a batch id Delta has committed (it would skip them as a replay).
    assert [r.batch_id for r in results] == [3, 4]
    assert results[0].realigned_from == 1 and not any(r.replayed for r in results)
    assert read_rows(source.raw_path, RAW) == expected_raw(first + later)
    assert transaction_version(source.raw_path, pipeline.source_id) == 4
    assert "the checkpoint's last committed batch is 1 but the lake has committed batch 2" in caplog.text
    # Batch 2 counts as committed for the backlog the watermark waits on, though the checkpoint never recorded it.
    assert source.checkpoints.load().watermark["probe"]["pending"] == []

    # Lost altogether, the same.
    shutil.rmtree(home / "checkpoints")
    extra = make_events(20, START_MS, 60_000, seed=5, prefix="x")
    publish_events(client, TOPIC, extra)
    (result,) = drain(lambda: spark, open_source(pipeline, LakeResource(home=str(home)), lambda: client))
    assert result.batch_id == 5 and result.inserted == 20 and result.realigned_from == 0
    assert read_rows(source.raw_path, RAW) == expected_raw(first + later + extra)

    # The plans of batches 1-4 went with the checkpoints; each commit carries its own, so the records of every batch
    # are still reconciled from their landed bytes.
    source = open_source(pipeline, LakeResource(home=str(home)), lambda: client)
    assert [source.checkpoints.get_plan(b) for b in range(1, 5)] == [None] * 4
    landed = landed_records(source)
    assert set(landed.records.column("record_id").to_pylist()) == {e.event_id for e in first + later + extra}
    assert reconcile_source(source, landed).ok


def test_an_old_copy_restored_while_a_batch_runs_still_learns_the_batches_it_skips(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = events_pipeline(max_messages=100)
    client, source = setup(new_project(), str(home), pipeline)
    events = make_events(300, START_MS, 60_000, seed=6)
    publish_events(client, TOPIC, events[:100])
    drain(lambda: spark, source)
    backup = tmp_path / "checkpoints-backup"
    publish_events(client, TOPIC, events[100:200])
    source.reader.before_batch(int(time.time() * 1000))  # the tracking subscription shows batch 2's messages
    shutil.copytree(home / "checkpoints", backup)  # taken after batch 1, with batch 2's messages pending
    drain(lambda: spark, source)
    publish_events(client, TOPIC, events[200:])

    # Batch 3 is planned on the checkpoint of batch 2; while it is ingested, the old copy comes back (as the chaos
    # harness's rollback does). Its checkpoint update then finds batch 1 there, below the batch before its own.
    ingest = micro_batch.ingest_batch

    def restored_meanwhile(*args, **kwargs):
        result = ingest(*args, **kwargs)
        shutil.rmtree(home / "checkpoints")
        shutil.copytree(backup, home / "checkpoints")
        return result

    monkeypatch.setattr(micro_batch, "ingest_batch", restored_meanwhile)
    (result,) = drain(lambda: spark, source)
    assert result.batch_id == 3 and result.inserted == 100

    checkpoint = source.checkpoints.load()
    assert checkpoint.committed_batch == 3 and [b for b, _ in checkpoint.recent_batches] == [1, 2, 3]
    # Batch 2's messages count as committed: pending, they would hold the watermark until newer commits expire them.
    assert checkpoint.watermark["probe"]["pending"] == []
    assert read_rows(source.raw_path, RAW) == expected_raw(events)


def test_a_reset_starts_a_new_epoch_with_a_new_app_id(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = tmp_path / "incoming"
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(incoming))
    monkeypatch.setenv("ONCEFLOW_MAX_FILES", "2")
    events = seed_files(incoming)
    lake = LakeResource(home=str(home))
    before = drain(lambda: spark, open_source(builtin("events"), lake))
    assert [r.batch_id for r in before] == [1, 2]

    reset = subprocess.run([sys.executable, "-m", "onceflow", "reset", "events"], capture_output=True,
                           text=True, timeout=120)
    assert reset.returncode == 0, reset.stderr
    assert "epoch 1 started; its source now commits as events/files@1, from batch 3" in reset.stdout
    assert EpochStore(lake.epochs()).current("events") == 1

    source = open_source(builtin("events"), lake)
    again = drain(lambda: spark, source)  # the new epoch takes every file again: all already held

    # Batch numbers go on across epochs: raw's batch ids order its rows whatever epoch committed them.
    assert source.app_id == "events/files@1" and [r.batch_id for r in again] == [3, 4]
    assert sum(r.inserted for r in again) == 0 and sum(r.dead_lettered_new for r in again) == 0
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert transaction_version(source.raw_path, "events/files") == 2
    assert transaction_version(source.raw_path, "events/files@1") == 4


def test_a_checkpoint_lost_after_traffic_stopped_is_realigned_and_its_windows_still_close(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_WATERMARK_BAND_S", "1")  # the watermark passes the windows a second after the drain
    pipeline, project = events_pipeline(max_messages=100), new_project()
    client, source = setup(project, str(home), pipeline)
    events = make_events(250, START_MS, 300_000, seed=6)
    publish_events(client, TOPIC, events)
    drain(lambda: spark, source)
    time.sleep(1.5)
    assert run_micro_batch(lambda: spark, source) is None
    before = source.checkpoints.load()
    lake, pubsub = LakeResource(home=str(home)), PubSubResource(project=project, emulator_host=pubsub_emulator.host)
    micro_batch = build_micro_batch_sensor(pipeline, idle_tick_s=3600)
    windows = build_window_sensor(pipeline, pipeline.outputs[0])
    with dg.instance_for_test() as instance:
        expected = [r.run_key for r in evaluate(windows, instance, lake, None).run_requests]
        assert len(expected) >= 2  # windows with data that the watermark has passed

        # Traffic is over when the checkpoints go (lost, or restored from a copy older than every batch): no new
        # message will ever make a batch run, yet the lake is ahead of the checkpoint, and that alone asks for one.
        shutil.rmtree(home / "checkpoints")
        assert isinstance(evaluate(windows, instance, lake, None), dg.SkipReason)
        [request] = evaluate(micro_batch, instance, lake, None, pubsub).run_requests
        assert request.tags["onceflow/why"] == "the lake is ahead of the checkpoint: realign it"

        source = open_source(pipeline, lake, lambda: client)
        assert run_micro_batch(lambda: spark, source) is None  # nothing new: it realigns, records the watermark
        after = source.checkpoints.load()
        # What the lost checkpoint knew comes back from the commits: the batches and the event-time range.
        assert after.committed_batch == before.committed_batch == 3
        assert (after.min_event_time_ms, after.max_event_time_ms) == (before.min_event_time_ms,
                                                                      before.max_event_time_ms)
        assert after.recent_batches == before.recent_batches
        assert [r.run_key for r in evaluate(windows, instance, lake, None).run_requests] == expected
        assert isinstance(evaluate(micro_batch, instance, lake, None, pubsub), dg.SkipReason)
    assert read_rows(source.raw_path, RAW) == expected_raw(events)


@pytest.mark.engine_paths
def test_a_batch_killed_between_its_dead_letters_and_raw_is_replayed_after_the_checkpoints_go(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = events_from_files(tmp_path, monkeypatch, max_files=2)
    events = seed_files(incoming)  # batch 1 (a, b) has the bad lines, batch 2 (c) none
    crashed = dagster_micro_batch(str(home), "ingest.after_dead_letters")
    assert "crash injected at ingest.after_dead_letters" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    source = open_source(builtin("events"), LakeResource(home=str(home)))
    assert transaction_version(source.dead_letter_path, source.app_id) == 1
    assert transaction_version(source.raw_path, source.app_id) is None  # batch 1's valid records are in no table

    shutil.rmtree(home / "checkpoints")  # lost (or restored from a copy older than batch 1): its plan goes too
    results = drain(lambda: spark, open_source(builtin("events"), LakeResource(home=str(home))))

    # Batch 1 is replayed from the plan its dead-letter commit carries, not skipped as committed.
    assert [(r.batch_id, r.realigned_from) for r in results] == [(1, None), (2, None)]
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert sorted(r[0] for r in read_rows(source.dead_letter_path, ["reason"])) == sorted(r for r, _ in BAD_LINES)
    assert results[0].dead_lettered_new == len(BAD_LINES) and all(r.balances() for r in results)
    assert source.checkpoints.load().totals == {"received": 310 + len(BAD_LINES), "inserted": 300, "duplicates": 10,
                                                 "dead_lettered": len(BAD_LINES)}


def test_a_landed_batch_killed_before_its_commit_is_requested_once_the_subscription_is_empty(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path
) -> None:
    pipeline, project = events_pipeline(max_messages=100, ack_deadline_s=2), new_project()
    client, source = setup(project, str(home), pipeline)
    events = make_events(60, START_MS, 60_000, seed=8)
    publish_events(client, TOPIC, events)
    crashed = dagster_micro_batch(str(home), "ingest.after_dead_letters", pubsub_project=project,
                                  max_messages="100", ack_deadline_s="2")
    assert "crash injected at ingest.after_dead_letters" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    # Landed and acknowledged, so the messages live in the landing file alone; the traffic is over.
    time.sleep(3)  # past the ack deadline: a message not acknowledged would be back by now
    assert client.pull(pipeline.source.subscription, 1000) == []
    assert transaction_version(source.raw_path, source.app_id) is None

    lake, pubsub = LakeResource(home=str(home)), PubSubResource(project=project, emulator_host=pubsub_emulator.host)
    sensor = build_micro_batch_sensor(pipeline, idle_tick_s=3600)
    with dg.instance_for_test() as instance:
        first = evaluate(sensor, instance, lake, None, pubsub)
        [request] = first.run_requests
        assert request.run_key == "events:batch:1" and request.tags["onceflow/why"] == "new data"
        assert source.reader.backlog(source.checkpoints.load()) == "batch 1 landed, not committed"
        assert [r.batch_id for r in drain(lambda: spark, source)] == [1]
        # The tick after, with the cursor the first left (no cursor would also be owed an idle tick, an hour on).
        after = evaluate(sensor, instance, lake, first.cursor, pubsub)
        assert isinstance(after, dg.SkipReason), after
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert source.reader.backlog(source.checkpoints.load()) == "empty"
