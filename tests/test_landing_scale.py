"""Pub/Sub landing with several pulls in flight and a byte bound per batch, exactly once (the emulator; rows read
back with delta-rs)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import DeclarationError
from onceflow.jobs.declare.sources import PubSubSource
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.orchestration.workload import expected_raw, make_events, publish_events, with_publisher_retries
from onceflow.resources.emulators.pubsub import PubSubEmulator
from onceflow.resources.pubsub import PubSubClient, PulledMessage
from onceflow.resources.settings import SettingsError, load_settings
from tests.delta_reader import read_rows
from tests.pipelines import TOPIC, dagster_micro_batch, drain, events_pipeline, new_project, setup

RAW = ["record_id", "event_time", "key", "value"]
START_MS = 1_763_720_000_000  # 2025-11-21T10:13:20Z
MAX_BYTES = 10_000


def landed_batches(source: SourceRuntime) -> Iterator[list[int]]:
    """The size (data and attributes) of every message of every landed batch, batch by batch."""
    for batch in range(1, source.checkpoints.load().committed_batch + 1):
        plan = source.checkpoints.get_plan(batch)
        assert plan is not None
        yield [len(r.data) + sum(len(k) + len(v) for k, v in (r.attributes or {}).items())
               for r in source.reader.landed_rows(plan)]


def test_a_batch_stops_at_its_byte_bound_and_the_rest_lands_next(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_MAX_BYTES", str(MAX_BYTES))
    monkeypatch.setenv("ONCEFLOW_PULL_STREAMS", "4")
    pipeline = events_pipeline(max_messages=10_000, ack_deadline_s=10)
    client, source = setup(new_project(), str(home), pipeline)
    events = make_events(150, START_MS, 300_000, seed=21)
    stream = with_publisher_retries(events, 0.10, seed=22)
    publish_events(client, TOPIC, stream)
    # One message larger than the bound on its own: it still lands, alone, instead of blocking the source.
    (big,) = make_events(1, START_MS, 1000, seed=23, prefix="big")
    client.publish(TOPIC, [(big.data, {**big.attributes(False), "padding": "x" * MAX_BYTES})])

    results = drain(lambda: spark, source)

    batches = list(landed_batches(source))
    assert all(sum(sizes) <= MAX_BYTES for sizes in batches if len(sizes) > 1)
    assert [sizes for sizes in batches if sum(sizes) > MAX_BYTES] == [[max(max(s) for s in batches)]]
    small = sum(sum(sizes) for sizes in batches if len(sizes) > 1)
    assert len(batches) >= small / MAX_BYTES + 1  # the bound cut the backlog into batches (the big one alone)
    assert sum(map(len, batches)) == sum(r.received for r in results) == len(stream) + 1
    assert read_rows(source.raw_path, RAW) == expected_raw([*events, big])
    assert sum(r.inserted for r in results) == 151 and sum(r.duplicates for r in results) == len(stream) - 150
    assert all(r.balances() for r in results)
    time.sleep(11)  # past the ack deadline: anything pulled but neither landed nor handed back would be back
    assert client.pull(pipeline.source.subscription, 1000) == []


class PeakPulls:
    """How many pulls were in flight at once (the real pulls, counted around each call)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = self.peak = 0
        self.lock = threading.Lock()
        original = PubSubClient.pull_answer

        def counted(client: PubSubClient, *args: object, **kwargs: object) -> list[PulledMessage] | None:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            try:
                return original(client, *args, **kwargs)  # type: ignore[arg-type]
            finally:
                with self.lock:
                    self.now -= 1

        monkeypatch.setattr(PubSubClient, "pull_answer", counted)


def test_parallel_pulls_with_redeliveries_land_exactly_once(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_PULL_STREAMS", "8")
    project = new_project()
    pipeline = events_pipeline(max_messages=300, ack_deadline_s=3)
    client, source = setup(project, str(home), pipeline)
    events = make_events(1500, START_MS, 300_000, seed=31)
    stream = with_publisher_retries(events, 0.2, seed=32)
    publish_events(client, TOPIC, stream)
    # The first run lands batch 1 and dies before its ack: its 300 messages are redelivered to the pulls below.
    crashed = dagster_micro_batch(
        str(home), "land.after_persist", pubsub_project=project, max_messages="300", ack_deadline_s="3",
        pull_streams="8",
    )
    assert "crash injected at land.after_persist" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    peak = PeakPulls(monkeypatch)

    results = drain(lambda: spark, source, redelivery_wait_s=4)

    assert peak.peak > 1
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert sum(r.received for r in results) >= len(stream) + 300  # every message, and batch 1's again
    assert sum(r.inserted for r in results) == 1500
    assert sum(r.duplicates_committed for r in results) >= 300  # the redelivered batch, known to the raw table
    assert all(r.balances() for r in results) and max(r.received for r in results) <= 300
    time.sleep(4)
    assert client.pull(pipeline.source.subscription, 1000) == []


def test_byte_bound_and_pull_streams_are_validated_and_filled_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_MAX_BYTES", "0")
    monkeypatch.setenv("ONCEFLOW_PULL_STREAMS", "65")
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert "ONCEFLOW_MAX_BYTES='0'" in str(raised.value) and "ONCEFLOW_PULL_STREAMS='65'" in str(raised.value)
    monkeypatch.setenv("ONCEFLOW_MAX_BYTES", "4096")
    monkeypatch.setenv("ONCEFLOW_PULL_STREAMS", "3")
    source = events_pipeline().source
    assert isinstance(source, PubSubSource) and (source.max_bytes, source.pull_streams) == (4096, 3)
    declared = events_pipeline()
    with pytest.raises(DeclarationError, match=r"source\.max_bytes: -1 must be positive"):
        dataclasses.replace(declared, source=dataclasses.replace(source, max_bytes=-1))
    with pytest.raises(DeclarationError, match=r"source\.pull_streams: 0 is outside 1\.\.64"):
        dataclasses.replace(declared, source=dataclasses.replace(source, pull_streams=0))
