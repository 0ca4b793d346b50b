"""The tests' Kafka broker and Spark's Kafka connector: records a real producer wrote (keys, headers, committed and
aborted transactions) read back through `spark.read.format("kafka")` on the engine path under test, so the
connector's jars reach both the Spark Connect server and a classic session."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec
from pyspark.sql import SparkSession

from onceflow.resources.emulators.kafka import KafkaBroker, KafkaBrokerError, start_kafka_broker
from onceflow.resources.kafka_jars import connector_dependencies, ensure_spark_kafka_jars

Record = tuple[int, int, str, str, list[tuple[str, bytes]]]  # partition, offset, key, value, headers


def produce(producer: Producer, topic: str, partition: int, key: str, headers: list[tuple[str, bytes]]) -> None:
    """Send one record and wait for it, so records land in the log in the order the test sends them."""
    producer.produce(topic, value=json.dumps({"key": key}), key=key, partition=partition, headers=headers)
    producer.flush(30)


def read_with_spark(
    spark: SparkSession, bootstrap: str, topic: str, starting: dict[int, int], ending: dict[int, int]
) -> list[Record]:
    """The records of `[starting, ending)` per partition, read committed, through Spark's Kafka batch source."""
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps({topic: sorted(starting)}))
        .option("startingOffsets", json.dumps({topic: {str(p): o for p, o in starting.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in ending.items()}}))
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .selectExpr("partition", "offset", "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "headers")
        .collect()
    )
    return sorted(
        (row.partition, row.offset, row.key, row.value, [(h.key, bytes(h.value)) for h in row.headers or []])
        for row in rows
    )


def await_stable_offset(consumer: Consumer, partition: TopicPartition, offset: int, timeout_s: float = 30) -> None:
    """Wait until `partition`'s last stable offset (a read-committed consumer's high watermark) is `offset`."""
    deadline = time.monotonic() + timeout_s
    while consumer.get_watermark_offsets(partition, timeout=10)[1] != offset:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{partition} did not become stable at offset {offset} in {timeout_s}s")
        time.sleep(0.1)


def record(partition: int, offset: int, key: str, headers: list[tuple[str, bytes]]) -> Record:
    return partition, offset, key, json.dumps({"key": key}), headers


@pytest.mark.engine_paths
def test_spark_reads_keys_headers_and_only_committed_transactions_from_the_broker(
    spark: SparkSession, kafka_broker: KafkaBroker
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=3)
    bootstrap = {"bootstrap.servers": kafka_broker.bootstrap}

    idempotent = Producer({**bootstrap, "enable.idempotence": True})
    expected = []
    for partition in range(3):
        for i in range(2):
            key, headers = f"k{partition}-{i}", [("event_id", f"e{partition}{i}".encode()), ("source", b"test")]
            produce(idempotent, topic, partition, key, headers)
            expected.append(record(partition, i, key, headers))

    # Two transactions interleaved on partition 0: each record takes the next offset, each end a marker offset.
    committing = Producer({**bootstrap, "transactional.id": f"{topic}-committing"})
    aborting = Producer({**bootstrap, "transactional.id": f"{topic}-aborting"})
    for producer in (committing, aborting):
        producer.init_transactions(30)
        producer.begin_transaction()
    produce(committing, topic, 0, "c1", [("event_id", b"c1")])  # offset 2
    produce(aborting, topic, 0, "a1", [("event_id", b"a1")])  # offset 3
    produce(committing, topic, 0, "c2", [])  # offset 4
    produce(aborting, topic, 0, "a2", [])  # offset 5
    produce(committing, topic, 1, "c3", [])  # partition 1, offset 2
    committing.commit_transaction(30)  # markers: partition 0 offset 6, partition 1 offset 3
    aborting.abort_transaction(30)  # marker: partition 0 offset 7
    consumer = Consumer({**bootstrap, "group.id": f"{topic}-probe", "isolation.level": "read_committed"})
    # The coordinator writes the markers after it answers: the last stable offset passes them once they are in.
    await_stable_offset(consumer, TopicPartition(topic, 0), 8)
    produce(idempotent, topic, 0, "after", [])  # offset 8
    expected += [record(0, 2, "c1", [("event_id", b"c1")]), record(0, 4, "c2", []), record(1, 2, "c3", []),
                 record(0, 8, "after", [])]

    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(3)}
    assert ends == {0: 9, 1: 4, 2: 2}

    # No aborted record and no marker is read; their offsets are gaps.
    assert read_with_spark(spark, kafka_broker.bootstrap, topic, dict.fromkeys(range(3), 0), ends) == sorted(expected)
    # A sub-range starting inside the gap reads only the committed records past it.
    assert read_with_spark(spark, kafka_broker.bootstrap, topic, {0: 3}, {0: 9}) == [
        record(0, 4, "c2", []), record(0, 8, "after", [])
    ]

    # Records the log no longer has: deleting partition 2 before offset 1 moves its earliest offset.
    admin = kafka_broker.admin()
    deleted = admin.delete_records([TopicPartition(topic, 2, 1)])
    assert next(iter(deleted.values())).result(30).low_watermark == 1
    earliest = admin.list_offsets({TopicPartition(topic, 2): OffsetSpec.earliest()})
    assert next(iter(earliest.values())).result(30).offset == 1
    assert consumer.get_watermark_offsets(TopicPartition(topic, 2), timeout=30) == (1, 2)
    assert read_with_spark(spark, kafka_broker.bootstrap, topic, {2: -2}, {2: 2}) == [
        record(2, 1, "k2-1", [("event_id", b"e21"), ("source", b"test")])
    ]
    consumer.close()


def test_the_connector_brings_the_jars_its_pom_names_that_spark_lacks() -> None:
    jars = ensure_spark_kafka_jars()
    pom = jars[0].with_suffix(".pom")

    # kafka-clients and commons-pool2 at the POM's versions; scala-parallel-collections and jsr305, which the POM
    # also names, are among Spark's own jars and are not fetched twice.
    assert [(a.group, a.artifact, a.version) for a in connector_dependencies(pom)] == [
        ("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.2.0"),
        ("org.apache.kafka", "kafka-clients", "3.9.2"),
        ("org.apache.commons", "commons-pool2", "2.13.1"),
    ]
    assert [jar.name for jar in jars] == [
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
        "spark-token-provider-kafka-0-10_2.13-4.2.0.jar",
        "kafka-clients-3.9.2.jar",
        "commons-pool2-2.13.1.jar",
    ]


def test_a_broker_that_cannot_start_fails_with_its_log(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """A second broker (`kafka_broker` stands for its requirements: Java, the jars) on a port in use dies at start."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(KafkaBrokerError, match="the Kafka broker exited") as failure:
            start_kafka_broker(tmp_path / "second", port=taken.getsockname()[1])
    assert "Address already in use" in str(failure.value)
