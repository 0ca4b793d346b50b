"""What onceflow writes to Kafka: a commit's records and its marker in one transaction, its marker read back
`read_committed`.

`TransactionalWriter.write` starts a producer with the sink's `transactional.id` (one per output and topic):
`init_transactions` fences every earlier producer of that id (a zombie of a dead run cannot commit after it) and
completes their transactions first, so the marker check that follows sees every commit that will ever land under
that id. Without the marker, the records (each with a `record_id` header, for consumers that deduplicate too) and
the marker (key: the commit id, on the markers topic) are sent in one transaction and committed. A consumer
reading `read_committed` sees the commit's records once, or none of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from onceflow.resources.faults import fault_point
from onceflow.resources.kafka import TIMEOUT_S, KafkaClient

RECORD_ID_HEADER = "record_id"
COMMIT_HEADER = "onceflow_commit"
_UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                          KafkaError._MSG_TIMED_OUT, KafkaError._RESOLVE, KafkaError._NOENT})


class TransactionalWriter:
    """Writes commits to `topic` (markers on `markers`) as `transactional_id`; created topics get the broker's
    defaults (markers: one partition)."""

    def __init__(self, servers: str, topic: str, markers: str, transactional_id: str,
                 options: Mapping[str, str] | None = None) -> None:
        self.topic, self.markers, self.transactional_id = topic, markers, transactional_id
        self.options = dict(options or {})
        self.client = KafkaClient(servers, self.options)
        self._seen: dict[str, int | None] = {}  # commit id -> the rows its marker says
        self._scanned_to = 0
        self._topics_ready = False

    def committed(self, commit_id: str) -> bool:
        """Whether a committed transaction holds `commit_id`'s marker (read `read_committed`, up to the markers
        topic's last stable offset; what was read is remembered, so each call reads only what is new)."""
        if commit_id in self._seen:
            return True
        with _reachable(self.topic):
            self._ensure_topics()
            end = self.client.offsets(self.markers, [0], "latest")[0]
            for record in self.client.records(self.markers, [(0, self._scanned_to, end)]):
                if record.key is not None:
                    self._seen[record.key.decode()] = _marker_rows(record.value)
        self._scanned_to = max(self._scanned_to, end)
        return commit_id in self._seen

    def rows_of(self, commit_id: str) -> int | None:
        """The rows `commit_id`'s marker says the commit holds; None when it is not committed."""
        return self._seen.get(commit_id) if self.committed(commit_id) else None

    def write(self, records: list[tuple[bytes | None, bytes, str | None]], commit_id: str, marker: dict[str, Any]) -> None:
        """Send `records` ((key, value, record id) each) and `commit_id`'s marker in one transaction, unless the
        commit is there already."""
        with _reachable(self.topic):
            self._write(records, commit_id, marker)

    def _write(self, records: list[tuple[bytes | None, bytes, str | None]], commit_id: str, marker: dict[str, Any]) -> None:
        self._ensure_topics()
        producer = Producer({**self.options, "bootstrap.servers": self.client.config["bootstrap.servers"],
                             "transactional.id": self.transactional_id, "linger.ms": 5,
                             "transaction.timeout.ms": 60_000})
        producer.init_transactions(TIMEOUT_S)
        try:
            if self.committed(commit_id):
                return
            producer.begin_transaction()
            for key, value, record_id in records:
                headers = [(COMMIT_HEADER, commit_id.encode())]
                if record_id is not None:
                    headers.append((RECORD_ID_HEADER, record_id.encode()))
                _produce(producer, self.topic, key, value, headers)
            _produce(producer, self.markers, commit_id.encode(), json.dumps(marker).encode(), [])
            fault_point("sink.kafka.before_commit")
            producer.commit_transaction(TIMEOUT_S)
            # Decided: the markers reach the partitions (and the last stable offset moves past them) a moment later.
            self._seen[commit_id] = len(records)
        except KafkaException:
            _abort(producer)
            raise
        finally:
            producer.flush(TIMEOUT_S)

    def _ensure_topics(self) -> None:
        if not self._topics_ready:
            for topic, partitions in ((self.topic, None), (self.markers, 1)):
                self.client.create_topic(topic, partitions)
                self.client.await_leaders(topic)
            self._topics_ready = True


def _marker_rows(value: bytes | None) -> int | None:
    try:
        rows = json.loads(value or b"{}").get("rows")
    except (ValueError, AttributeError):
        return None  # a marker onceflow did not write: it counts as committed, its rows unknown
    return rows if isinstance(rows, int) else None


@contextmanager
def _reachable(topic: str) -> Iterator[None]:
    """A cluster that cannot be reached now (a retriable error, a timeout) is a `ConnectionError`: the attempt uses
    no budget. A fenced or fatal producer is not: another writer took over."""
    try:
        yield
    except TimeoutError as error:
        raise ConnectionError(f"Kafka ({topic}): {error}") from error
    except KafkaException as error:
        kafka_error = error.args[0] if error.args else None
        if isinstance(kafka_error, KafkaError) and (kafka_error.retriable() or kafka_error.code() in _UNREACHABLE):
            raise ConnectionError(f"Kafka ({topic}): {kafka_error.str()}") from error
        raise


def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes, headers: list) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=headers)
            return
        except BufferError:  # the local queue is full: let it drain
            producer.poll(0.1)


def _abort(producer: Producer) -> None:
    # Fenced or broken: the broker aborts the transaction when it times out, or the next writer's init does.
    with suppress(KafkaException):
        producer.abort_transaction(TIMEOUT_S)
