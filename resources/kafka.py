"""What onceflow asks a Kafka topic outside Spark: its partitions, their offsets, the records of offset ranges (an
independent reading, for counts and reconciliation), and the consumer group's offsets it reports for lag tools.

Every reading is `read_committed`: records of aborted transactions are skipped and the offsets of transaction
markers are gaps, exactly as Spark's Kafka source reads the same ranges. The "latest" offset of a partition is its
last stable offset: nothing below it belongs to a transaction still open.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

TIMEOUT_S = 30.0
CONSUME_BATCH = 1000
CONSUME_WAIT_S = 0.05


class KafkaTopicMissing(RuntimeError):
    """The topic a source names does not exist on the cluster."""


@dataclass(frozen=True)
class KafkaRecord:
    """One record as the log holds it; `headers` in their order (a key may repeat)."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class KafkaLog:
    """Which log a topic name stands for now: the cluster's id and the topic's id (KIP-516), which a topic
    re-created under its name, or the same name on another cluster (a DR replica), does not share."""

    cluster_id: str
    topic_id: str


class KafkaClient:
    """A client of the cluster at `servers` with the source's consumer `options` (security settings and such)."""

    def __init__(self, servers: str, options: Mapping[str, str] | None = None) -> None:
        self.config = {**(options or {}), "bootstrap.servers": servers}

    @cached_property
    def admin(self) -> AdminClient:
        return AdminClient(self.config)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions, in order."""
        metadata = self.admin.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise KafkaTopicMissing(f"Kafka topic {topic!r} does not exist on {self.config['bootstrap.servers']}")
        return sorted(metadata.partitions)

    def log(self, topic: str) -> KafkaLog:
        """The log `topic` names on this cluster now."""
        cluster = self.admin.describe_cluster(request_timeout=TIMEOUT_S).result()
        try:
            described = self.admin.describe_topics(TopicCollection([topic]), request_timeout=TIMEOUT_S)[topic].result()
        except KafkaException as error:
            if error.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaTopicMissing(f"Kafka topic {topic!r} does not exist on {self.config['bootstrap.servers']}") \
                    from None
            raise
        return KafkaLog(_canonical(str(cluster.cluster_id)), _canonical(str(described.topic_id)))

    def offsets(
        self, topic: str, partitions: list[int], which: Literal["earliest", "latest", "high"]
    ) -> dict[int, int]:
        """Each partition's first offset still held (`earliest`), its last stable offset (`latest`: nothing below it
        belongs to an open transaction) or its high watermark (`high`: past every record written, committed or not)."""
        if not partitions:
            return {}
        spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()
        isolation = IsolationLevel.READ_UNCOMMITTED if which == "high" else IsolationLevel.READ_COMMITTED
        futures = self.admin.list_offsets({TopicPartition(topic, p): spec for p in partitions},
                                          isolation_level=isolation, request_timeout=TIMEOUT_S)
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    def create_topic(self, topic: str, partitions: int | None = None, config: Mapping[str, str] | None = None) -> None:
        """Create the topic (the broker's default partition count unless given, topic `config` such as
        `retention.ms`); an existing one is left as is."""
        new = NewTopic(topic, num_partitions=partitions or -1, config=dict(config or {}))
        future = self.admin.create_topics([new])[topic]
        try:
            future.result(timeout=TIMEOUT_S)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def await_leaders(self, topic: str) -> None:
        """Wait until every partition of `topic` has a leader (a topic just created has none for a moment)."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            metadata = self.admin.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
            if (metadata is not None and metadata.error is None and metadata.partitions
                    and all(p.leader >= 0 for p in metadata.partitions.values())):
                return
            time.sleep(0.1)
        raise TimeoutError(f"Kafka topic {topic!r}: partitions without a leader after {TIMEOUT_S:.0f}s")

    def records(self, topic: str, ranges: list[tuple[int, int, int]]) -> Iterator[KafkaRecord]:
        """The committed records of each `(partition, from, until)` range, partition by partition."""
        wanted = [(p, start, until) for p, start, until in ranges if until > start]
        if not wanted:
            return
        consumer = Consumer({**self.config, "group.id": "onceflow-reader", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "enable.partition.eof": True})
        try:
            for partition, start, until in wanted:
                yield from _read_range(consumer, topic, partition, start, until)
        finally:
            consumer.close()

    def commit_group(self, group: str, topic: str, ends: Mapping[int, int]) -> None:
        """Record `ends` as the group's committed offsets: for users' lag tools only, never read back."""
        consumer = Consumer({**self.config, "group.id": group, "enable.auto.commit": False})
        try:
            consumer.commit(offsets=[TopicPartition(topic, p, end) for p, end in ends.items()], asynchronous=False)
        finally:
            consumer.close()


def _canonical(uuid: str) -> str:
    """A Kafka id as Kafka itself writes one (`Uuid.toString`: URL-safe base64), whatever alphabet the client used."""
    return uuid.replace("+", "-").replace("/", "_")


def _read_range(consumer: Consumer, topic: str, partition: int, start: int, until: int) -> Iterator[KafkaRecord]:
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + TIMEOUT_S
    # The position passes aborted records and transaction markers without returning them.
    while consumer.position([TopicPartition(topic, partition)])[0].offset < until:
        # Many at a time (one call per record is slow); `consume` waits for all of them or the timeout, so it is short.
        messages = consumer.consume(CONSUME_BATCH, CONSUME_WAIT_S)
        if messages:
            deadline = time.monotonic() + TIMEOUT_S
        elif time.monotonic() > deadline:
            raise TimeoutError(f"Kafka {topic}/{partition}: no record below offset {until} within {TIMEOUT_S}s")
        for message in messages:
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(error)
            if message.offset() >= until:
                return
            if error is None:
                yield KafkaRecord(partition, message.offset(), message.timestamp()[1], message.key(),
                                  message.value(), tuple(message.headers() or ()))
