"""`events` workloads for the demo, tests and benchmarks: events, publisher retries, bad input, and a publisher
that streams them in real time, to Pub/Sub or (`KafkaEventsClient`) to Kafka."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from confluent_kafka import Producer

from onceflow.jobs.sources.landed_ids import parse_time_ms
from onceflow.jobs.windows.panes import Window
from onceflow.resources.pubsub import PubSubClient


@dataclass(frozen=True)
class Event:
    event_id: str
    event_time_ms: int
    key: str
    value: int

    @property
    def data(self) -> bytes:
        return json.dumps({"key": self.key, "value": self.value}).encode()

    def attributes(self, rfc3339: bool) -> dict[str, str]:
        if rfc3339:
            stamp = datetime.fromtimestamp(self.event_time_ms / 1000, UTC).isoformat(timespec="milliseconds")
            return {"event_id": self.event_id, "event_time": stamp.replace("+00:00", "Z")}
        return {"event_id": self.event_id, "event_time": str(self.event_time_ms)}

    def json_line(self) -> str:
        return json.dumps(
            {"event_id": self.event_id, "event_time": self.event_time_ms, "key": self.key, "value": self.value}
        )

    def expected_row(self) -> tuple[str, datetime, str, Decimal]:
        return (self.event_id, self.event_datetime, self.key, Decimal(self.value).quantize(Decimal("1.000000000")))

    @property
    def event_datetime(self) -> datetime:
        return datetime.fromtimestamp(self.event_time_ms / 1000, UTC)


def make_events(n: int, start_ms: int, span_ms: int, seed: int = 7, prefix: str = "e") -> list[Event]:
    rng = random.Random(seed)
    return [
        Event(f"{prefix}{i:06d}", start_ms + rng.randrange(span_ms), f"k{rng.randrange(10)}", rng.randrange(-50, 1000))
        for i in range(n)
    ]


def with_publisher_retries(events: list[Event], fraction: float, seed: int = 11) -> list[Event]:
    """The events plus re-publishes of a `fraction` of them (same event_id, a new Pub/Sub message), shuffled."""
    rng = random.Random(seed)
    retries = rng.sample(events, int(len(events) * fraction))
    stream = events + retries
    rng.shuffle(stream)
    return stream


# One malformed message of each kind ingest must dead-letter, with the reason it must give.
MALFORMED: list[tuple[str, bytes, dict[str, str]]] = [
    ("not_json", b"this is not json", {"event_id": "bad-not-json", "event_time": "1763720000000"}),
    ("not_json", b"[1, 2, 3]", {"event_id": "bad-array", "event_time": "1763720000000"}),
    ("not_json", b"\xff\xfe{}", {"event_id": "bad-utf8", "event_time": "1763720000000"}),
    ("missing_field", b'{"value": 1}', {"event_id": "bad-no-key", "event_time": "1763720000000"}),
    ("wrong_type", b'{"key": "k1", "value": true}', {"event_id": "bad-value-bool", "event_time": "1763720000000"}),
    ("missing_field", b'{"key": "k1"}', {"event_id": "bad-no-value", "event_time": "1763720000000"}),
    ("wrong_type", b'{"key": "k1", "value": "twelve"}', {"event_id": "bad-value-type", "event_time": "1763720000000"}),
    ("out_of_range", b'{"key": "k1", "value": 1e40}', {"event_id": "bad-huge", "event_time": "1763720000000"}),
    ("bad_event_time", b'{"key": "k1", "value": 1}', {"event_id": "bad-time", "event_time": "yesterday"}),
    ("oversized", b'{"key": "k1", "value": 1, "pad": "' + b"x" * 70_000 + b'"}',
     {"event_id": "bad-big", "event_time": "1763720000000"}),
]


# On Kafka the event time is the record timestamp, which cannot be malformed.
KAFKA_MALFORMED = [message for message in MALFORMED if message[0] != "bad_event_time"]


class KafkaEventsClient:
    """Sends `(data, attributes)` messages to a Kafka topic as a producer of such events would: the attributes as
    headers, the event id as the key (a retry lands in the same partition), the event time as the record
    timestamp. Stands in for a `PubSubClient` in `Publisher`."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})

    def publish(self, topic: str, messages: list[tuple[bytes, dict[str, str]]]) -> None:
        for data, attributes in messages:
            self.producer.produce(topic, value=data, key=attributes["event_id"].encode(),
                                  headers=list(attributes.items()),
                                  timestamp=parse_time_ms(attributes["event_time"]) or 0)
        self.producer.flush(30)


def publish_events(client: PubSubClient, topic: str, events: list[Event], rfc3339_every: int = 2) -> None:
    """Publish in order; every `rfc3339_every`-th event carries an RFC 3339 time, the rest epoch millis."""
    client.publish(topic, [(e.data, e.attributes(i % rfc3339_every == 0)) for i, e in enumerate(events)])


def expected_raw(events: list[Event]) -> list[tuple[str, datetime, str, Decimal]]:
    unique = {e.event_id: e for e in reversed(events)}  # the first occurrence wins
    return sorted(e.expected_row() for e in unique.values())


@dataclass
class Expected:
    """What the workload published, per window key: the on-time events (first occurrence per ID) and late ones."""

    on_time: dict[str, dict[str, Event]] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    late_ids: set[str] = field(default_factory=set)
    malformed_ids: set[str] = field(default_factory=set)
    publish_ms: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    retries: int = 0
    malformed: int = 0

    @property
    def valid_ids(self) -> set[str]:
        """Every valid record ID published: on time or late, each once however often it was resent."""
        return {i for events in self.on_time.values() for i in events} | self.late_ids

    def counts(self, window: str) -> dict[str, tuple[int, Decimal]]:
        per_key: dict[str, tuple[int, Decimal]] = {}
        for event in self.on_time.get(window, {}).values():
            count, total = per_key.get(event.key, (0, Decimal(0)))
            per_key[event.key] = (count + 1, total + event.value)
        return per_key


class Worker(threading.Thread):
    """A daemon thread doing `work`; `done` is set however it ends and `error` holds what it raised, for the
    driver to report."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as error:  # reported by the driver
            self.error = error
        finally:
            self.done.set()

    def work(self) -> None:
        raise NotImplementedError


class Publisher(Worker):
    """Publishes `rate` events a second for `duration_s` with event times near now, publisher retries, malformed
    messages, and, once the first window has closed, late events into it."""

    # A publisher retries within seconds (its ack timed out), so only events this recent are resent: a retry
    # minutes later would carry an old event time and rightly hold the watermark back.
    retry_within_s = 5.0
    # How long past `duration_s` to wait for the first window to close (to send late events into it).
    late_within_s = 600.0

    def __init__(
        self, client, topic: str, duration_s: float, rate: int, first_closed: Callable[[], str | None], seed: int = 42,
        malformed: list[tuple[str, bytes, dict[str, str]]] = MALFORMED,
    ):
        super().__init__()
        self.client, self.topic, self.duration_s, self.rate, self.seed = client, topic, duration_s, rate, seed
        self.malformed = malformed
        self.first_closed = first_closed
        self.expected = Expected()
        self.held = threading.Event()  # set: publish nothing until cleared (an operator working on the topic)

    def _send(self, messages: list[tuple[bytes, dict[str, str]]]) -> None:
        if messages:
            self.client.publish(self.topic, messages)
            self.expected.messages += len(messages)

    def work(self) -> None:
        rng = random.Random(self.seed)
        start = time.time()
        seq, late_done, retry_pool = 0, False, []
        # After `duration_s`, only wait (within reason) for the first window to close, then send the late events:
        # on a slow machine that can take several minutes, and the demo's check needs them.
        while time.time() - start < self.duration_s or (not late_done and time.time() - start < self.late_within_s):
            if self.held.is_set():
                time.sleep(0.2)
                continue
            tick = time.time()
            now_ms = int(tick * 1000)
            messages = []
            publishing = tick - start < self.duration_s
            if publishing:
                for _ in range(self.rate):
                    # Out of order within a few seconds: the watermark band absorbs it, nothing is late.
                    event = Event(f"ev{seq:07d}", now_ms - rng.randrange(3000), f"k{rng.randrange(8)}", rng.randrange(1, 100))
                    seq += 1
                    self.expected.on_time.setdefault(_key(event.event_time_ms), {})[event.event_id] = event
                    self.expected.publish_ms[event.event_id] = now_ms
                    messages.append((event.data, event.attributes(seq % 2 == 0)))
                    if rng.random() < 0.1:
                        retry_pool.append((tick, event))
                retry_pool = [(sent, event) for sent, event in retry_pool if tick - sent < self.retry_within_s]
                if retry_pool and rng.random() < 0.7:  # a publisher retry: same event_id, a new message
                    _, event = retry_pool.pop(rng.randrange(len(retry_pool)))
                    messages.append((event.data, event.attributes(True)))
                    self.expected.retries += 1
                if rng.random() < 0.15:
                    kind, data, attributes = self.malformed[rng.randrange(len(self.malformed))]
                    if kind != "bad_event_time":
                        attributes = {**attributes, "event_time": str(now_ms)}
                    messages.append((data, {**attributes, "event_id": f"bad-{seq}"}))
                    self.expected.malformed += 1
                    self.expected.malformed_ids.add(f"bad-{seq}")
            closed = None if late_done else self.first_closed()
            if closed is not None:
                late_done = True
                base = Window.from_partition_key(closed, 60).start_ms
                for i in range(20):
                    late = Event(f"late{i:03d}", base + rng.randrange(60_000), f"k{rng.randrange(8)}", 1000)
                    messages.append((late.data, late.attributes(False)))
                    self.expected.late_ids.add(late.event_id)
                self.expected.late[closed] = 20
            self._send(messages)
            time.sleep(max(0.0, 1.0 - (time.time() - tick)))


def _key(time_ms: int) -> str:
    return Window.at(time_ms, 60).key
