"""Exactly-once ingest from Pub/Sub (the emulator) into the raw Delta table, checked with delta-rs."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.ingest.batch_ingest import ingest_batch
from onceflow.jobs.ingest.batch_read import read_batch
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.orchestration.workload import (
    MALFORMED,
    expected_raw,
    make_events,
    publish_events,
    with_publisher_retries,
)
from onceflow.resources.emulators.pubsub import PubSubEmulator
from onceflow.resources.object_store import LocalStore
from tests.delta_reader import read_rows, table_version, transaction_version
from tests.pipelines import TOPIC, dagster_micro_batch, drain, events_pipeline, new_project, setup

RAW = ["record_id", "event_time", "key", "value"]
START_MS = 1_763_720_000_000  # 2025-11-21T10:13:20Z


def replay_batch(spark: SparkSession, source: SourceRuntime, batch_id: int) -> IngestResult:
    """Ingest an already committed batch again, as a retried run would."""
    plan = source.checkpoints.get_plan(batch_id)
    assert plan is not None
    landed = source.reader.landed(spark, plan)
    return ingest_batch(spark, source, plan, read_batch(spark, source, plan, landed))


def test_publisher_retries_land_exactly_once(spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path) -> None:
    pipeline = events_pipeline(max_messages=700, ack_deadline_s=10)
    client, source = setup(new_project(), str(home), pipeline)
    events = make_events(2000, START_MS, 300_000)
    stream = with_publisher_retries(events, 0.10)
    publish_events(client, TOPIC, stream)

    results = drain(lambda: spark, source)

    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert sum(r.received for r in results) == len(stream) == 2200
    assert sum(r.inserted for r in results) == 2000
    assert sum(r.duplicates for r in results) == 200
    assert all(r.balances() for r in results)
    assert source.checkpoints.load().committed_batch == len(results)
    time.sleep(11)  # past the ack deadline: anything pulled but not acked would be back by now
    assert client.pull(pipeline.source.subscription, 1000) == []


@pytest.mark.parametrize("crash_at", ["land.before_persist", "land.after_persist", "ingest.after_merge"])
def test_crash_then_rerun_gives_the_same_table(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path, crash_at: str
) -> None:
    project = new_project()
    pipeline = events_pipeline(max_messages=300, ack_deadline_s=3)
    client, source = setup(project, str(home), pipeline)
    events = make_events(500, START_MS, 300_000, seed=3)
    stream = with_publisher_retries(events, 0.2, seed=4)
    publish_events(client, TOPIC, stream)

    crashed = dagster_micro_batch(
        str(home), crash_at, pubsub_project=project, max_messages="300", ack_deadline_s="3"
    )
    assert f"crash injected at {crash_at}" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    assert crashed.returncode != 0

    results = drain(lambda: spark, source, redelivery_wait_s=4)

    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert all(r.balances() for r in results)
    assert source.checkpoints.load().totals["inserted"] == 500  # exact, whatever the crash
    if crash_at == "ingest.after_merge":
        # Batch 1 committed before the crash: its replay is skipped by the SetTransaction.
        assert results[0].batch_id == 1 and results[0].replayed
    time.sleep(4)
    assert client.pull(pipeline.source.subscription, 1000) == []


def test_expired_ack_deadline_is_redelivered_and_lands_once(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = events_pipeline(ack_deadline_s=2)
    client, source = setup(new_project(), str(home), pipeline)
    events = make_events(50, START_MS, 60_000, seed=5)
    publish_events(client, TOPIC, events)

    # The lease cannot reach Pub/Sub and persisting is slow: the deadline lapses before the ack and Pub/Sub
    # redelivers the messages to another puller, so the late ack carries stale ack ids and is ignored.
    monkeypatch.setattr(type(client), "modify_ack_deadline", lambda *a, **k: None)
    original_create = LocalStore.create
    redelivered: list = []

    def slow_create(self: LocalStore, key: str, data: bytes) -> bool:
        time.sleep(2.5)
        redelivered.extend(client.pull(pipeline.source.subscription, 1000))
        return original_create(self, key, data)

    monkeypatch.setattr(LocalStore, "create", slow_create)
    first = run_micro_batch(lambda: spark, source)
    monkeypatch.undo()
    again = drain(lambda: spark, source, redelivery_wait_s=3)

    assert first is not None and first.inserted == 50
    assert {m.attributes["event_id"] for m in redelivered} == {e.event_id for e in events}
    assert {r.batch_id for r in again} and sum(r.inserted for r in again) == 0  # all came back ...
    assert sum(r.duplicates_committed for r in again) >= 50  # ... and were recognised as already committed
    assert read_rows(source.raw_path, RAW) == expected_raw(events)


def test_replaying_a_committed_batch_changes_nothing(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path
) -> None:
    pipeline = events_pipeline()
    client, source = setup(new_project(), str(home), pipeline)
    events = make_events(100, START_MS, 60_000, seed=6)
    publish_events(client, TOPIC, events)
    (first,) = drain(lambda: spark, source)
    version = table_version(source.raw_path)
    rows = read_rows(source.raw_path, [*RAW, "batch_id", "ingested_at"])

    replay = replay_batch(spark, source, 1)

    assert first.inserted == 100 and not first.replayed
    # Nothing is written; the counts are those of the commit that did the work.
    assert replay.replayed and replay.inserted == 100 and replay.balances()
    assert table_version(source.raw_path) == version  # no commit at all
    assert read_rows(source.raw_path, [*RAW, "batch_id", "ingested_at"]) == rows
    assert transaction_version(source.raw_path, pipeline.source_id) == 1


def test_malformed_messages_are_dead_lettered_with_reasons(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path
) -> None:
    pipeline = events_pipeline()
    client, source = setup(new_project(), str(home), pipeline)
    good = make_events(20, START_MS, 60_000, seed=8)
    publish_events(client, TOPIC, good)
    client.publish(TOPIC, [(data, attrs) for _, data, attrs in MALFORMED])
    # A retry of a good event and a message with no id attribute (it falls back to its message id).
    publish_events(client, TOPIC, good[:1])
    client.publish(TOPIC, [(b'{"key": "k0", "value": 7}', {"event_time": str(START_MS)})])

    (result,) = drain(lambda: spark, source)

    dead = read_rows(source.dead_letter_path, ["record_id", "reason"])
    assert dead == sorted((attrs["event_id"], reason) for reason, _, attrs in MALFORMED)
    assert {r[0] for r in read_rows(source.dead_letter_path, ["detail"])} != {None}
    assert result.received == 20 + len(MALFORMED) + 2
    assert result.inserted == 21 and result.duplicates == 1
    assert result.dead_lettered_total == len(MALFORMED)
    assert result.balances()
    raw_ids = [r[0] for r in read_rows(source.raw_path, ["record_id"])]
    assert len(raw_ids) == 21 and sum(not i.startswith("e") for i in raw_ids) == 1  # the message-id fallback


def test_records_beyond_the_dedup_horizon_are_dead_lettered(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path
) -> None:
    # The watermark must not move to the wall clock between the two drains, however slow the machine: neither by
    # the idle rule nor because the first drain's samples fell out of the band once the subscription was empty.
    pipeline = dataclasses.replace(events_pipeline(), dedup_horizon="1h", watermark_idle="1d", watermark_band="1d")
    client, source = setup(new_project(), str(home), pipeline)
    publish_events(client, TOPIC, make_events(10, START_MS, 60_000, seed=9))
    drain(lambda: spark, source)
    old = make_events(3, START_MS - 2 * 3600_000, 1000, seed=10, prefix="old")
    recent = make_events(3, START_MS - 1800_000, 1000, seed=10, prefix="recent")
    publish_events(client, TOPIC, old + recent)

    (result,) = drain(lambda: spark, source)

    assert result.dead_lettered == {"beyond_dedup_horizon": 3}
    assert result.inserted == 3
    assert [r for r in read_rows(source.dead_letter_path, ["record_id", "reason"])] == [
        (e.event_id, "beyond_dedup_horizon") for e in old
    ]


def test_at_least_once_keeps_duplicates(spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path) -> None:
    pipeline = events_pipeline(delivery="at_least_once")
    client, source = setup(new_project(), str(home), pipeline)
    events = make_events(300, START_MS, 60_000, seed=12)
    stream = with_publisher_retries(events, 0.10, seed=13)
    publish_events(client, TOPIC, stream)

    results = drain(lambda: spark, source)

    rows = read_rows(source.raw_path, RAW)
    assert len(rows) == 330
    assert sorted(set(rows)) == expected_raw(events)
    assert sum(r.inserted for r in results) == 330 and sum(r.duplicates for r in results) == 0
    # A replay of a whole batch is still skipped: at-least-once does not mean "write twice on retry".
    replay = replay_batch(spark, source, 1)
    assert replay.replayed and len(read_rows(source.raw_path, RAW)) == 330
