"""The Kafka watermark under what producers do, on a real KRaft broker: a transaction held open past the idle time
holds it (its records are on time when it commits), and a partition that brings only malformed lines lets it go
after the idle time (windows keep closing)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from onceflow.jobs.sources.reader import SourceRuntime, source_watermark_ms
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.resources.emulators.kafka import KafkaBroker
from onceflow.resources.kafka import KafkaClient
from onceflow.resources.lake import LakeResource
from tests.pipelines import drain
from tests.test_kafka_source import clicks_source

IDLE_S = 3


@pytest.fixture
def topic(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"clicks-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, partitions=3)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_broker.bootstrap)
    monkeypatch.setenv("KAFKA_TOPIC", name)
    monkeypatch.setenv("ONCEFLOW_WATERMARK_IDLE_S", str(IDLE_S))
    return name


def body(at_ms: int, n: int) -> bytes:
    stamp = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps({"user": f"u{n % 4}", "amount": "1.00", "ts": stamp}).encode()


def send(producer: Producer, topic: str, partition: int, prefix: str, times_ms: list[int]) -> None:
    for n, at in enumerate(times_ms):
        producer.produce(topic, value=body(at, n), partition=partition, headers=[("event_id", f"{prefix}{n}".encode())])
    producer.flush(30)


def idle_polls(spark: SparkSession, source: SourceRuntime, seconds: float) -> None:
    """Batches and idle polls for `seconds`, past the idle time, as a sensor's ticks would run them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        drain(lambda: spark, source)
        time.sleep(0.5)


def close(spark: SparkSession, source: SourceRuntime, home: Path, window: Window):
    output = source.pipeline.outputs[0]
    lake = LakeResource(home=str(home))
    (result,) = materialize_windows(spark, source.pipeline, output, [window],
                                    source_watermark_ms(source.checkpoints.load()),
                                    CloseStore(lake.panes(), output.asset), source.raw_path,
                                    lake.table_path(output.table))
    return result


def test_a_transaction_held_open_past_the_idle_time_holds_the_watermark_and_its_records_are_on_time(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    window = Window.at(int(time.time() * 1000) - 20 * 60_000, 60)
    plain = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    held = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"{topic}-tx"})
    held.init_transactions(30)
    send(plain, topic, 0, "a", [window.start_ms + i * 1000 for i in range(20)])
    held.begin_transaction()  # a Flink exactly-once sink between two checkpoints, over the same window
    send(held, topic, 1, "t", [window.start_ms + 20_000 + i * 500 for i in range(40)])
    send(plain, topic, 0, "b", [window.end_ms + 10 * 60_000])  # the other partition far ahead
    source = clicks_source(home)
    idle_polls(spark, source, IDLE_S * 3)
    watermark = source_watermark_ms(source.checkpoints.load())
    assert watermark is None or watermark < window.end_ms  # the open transaction holds it

    held.commit_transaction(30)
    client, deadline = KafkaClient(kafka_broker.bootstrap), time.monotonic() + 30
    while client.offsets(topic, [1], "latest")[1] < 41:  # its marker stable
        assert time.monotonic() < deadline
        time.sleep(0.2)
    idle_polls(spark, source, IDLE_S * 3)
    result = close(spark, source, home, window)
    assert (result.closed, result.records, result.late) == (True, 60, 0)


def test_a_partition_of_only_malformed_lines_stops_holding_the_watermark_after_the_idle_time(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    window = Window.at(int(time.time() * 1000) - 20 * 60_000, 60)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    source = clicks_source(home)
    deadline = time.monotonic() + IDLE_S * 4
    step = 0
    while time.monotonic() < deadline:  # partition 0 moves on; partition 2 keeps bringing lines that are not JSON
        send(producer, topic, 0, f"a{step}-", [window.start_ms + step * 60_000 + i * 1000 for i in range(5)])
        for n in range(3):
            producer.produce(topic, value=b"not json", partition=2, headers=[("event_id", f"bad{step}-{n}".encode())])
        producer.flush(30)
        drain(lambda: spark, source)
        step += 1
        time.sleep(1)
    watermark = source_watermark_ms(source.checkpoints.load())
    assert watermark is not None and watermark >= window.end_ms
    result = close(spark, source, home, window)
    assert (result.closed, result.records) == (True, 5)
