"""Deterministic `events` workloads for the demo, tests and benchmarks: events, publisher retries, bad input."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from resources.pubsub import PubSubClient


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
    ("wrong_type", b'{"key": 5, "value": 1}', {"event_id": "bad-key-type", "event_time": "1763720000000"}),
    ("missing_field", b'{"key": "k1"}', {"event_id": "bad-no-value", "event_time": "1763720000000"}),
    ("wrong_type", b'{"key": "k1", "value": "12"}', {"event_id": "bad-value-type", "event_time": "1763720000000"}),
    ("out_of_range", b'{"key": "k1", "value": 1e40}', {"event_id": "bad-huge", "event_time": "1763720000000"}),
    ("bad_event_time", b'{"key": "k1", "value": 1}', {"event_id": "bad-time", "event_time": "yesterday"}),
    ("oversized", b'{"key": "k1", "value": 1, "pad": "' + b"x" * 70_000 + b'"}',
     {"event_id": "bad-big", "event_time": "1763720000000"}),
]


def publish_events(client: PubSubClient, topic: str, events: list[Event], rfc3339_every: int = 2) -> None:
    """Publish in order; every `rfc3339_every`-th event carries an RFC 3339 time, the rest epoch millis."""
    client.publish(topic, [(e.data, e.attributes(i % rfc3339_every == 0)) for i, e in enumerate(events)])


def expected_raw(events: list[Event]) -> list[tuple[str, datetime, str, Decimal]]:
    unique = {e.event_id: e for e in reversed(events)}  # the first occurrence wins
    return sorted(e.expected_row() for e in unique.values())
