"""The tracking subscription: drained continuously, acked at once, kept only as watermark samples.

Each message on a Pub/Sub source's metadata-only tracking subscription becomes a `TrackingSample` (message id,
publish time, event time) for `PubSubWatermark` and its backlog probe. Nothing else is kept: the data itself is
landed from the base subscription.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from jobs.declaration import PubSubSource
from resources.pubsub import PubSubClient, PulledMessage

# The same rule as ingest: up to 15 digits is epoch milliseconds, anything else must be an RFC 3339 timestamp.
_EPOCH_MS = re.compile(r"^-?[0-9]{1,15}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def parse_event_time_ms(raw: str | None) -> int | None:
    """An event-time attribute as epoch milliseconds: integer milliseconds or RFC 3339; None if neither.

    A timestamp without an offset is taken as UTC (as ingest's Spark session does); fractions finer than a
    millisecond are truncated.
    """
    if raw is None:
        return None
    text = raw.strip()
    if _EPOCH_MS.match(text):
        return int(text)
    try:
        parsed = datetime.fromisoformat(text.upper())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - _EPOCH) // _ONE_MS


def sample_of(message: PulledMessage, timestamp_attribute: str | None) -> TrackingSample:
    """The watermark sample of one message; its event time falls back to the publish time when the timestamp
    attribute is not declared, missing or unparsable (such a record is dead-lettered by ingest anyway)."""
    raw = message.attributes.get(timestamp_attribute) if timestamp_attribute else None
    event_ms = parse_event_time_ms(raw)
    return TrackingSample(
        message_id=message.message_id,
        publish_time_ms=message.publish_time_ms,
        event_time_ms=message.publish_time_ms if event_ms is None else event_ms,
    )


@dataclass(frozen=True)
class TrackingSample:
    """One message seen on a tracking subscription: its id, its publish time and its event time (epoch ms).

    `message_id` and `publish_time_ms` are those the base subscription sees for the same published message.
    """

    message_id: str
    publish_time_ms: int
    event_time_ms: int


@dataclass(frozen=True)
class TrackingDrain:
    """What one drain of the tracking subscription saw.

    `caught_up` is true when the drain ended on an empty pull; `tracked_through_ms` is then the drain's start
    time (everything published before it has been seen) and None otherwise, as `PubSubWatermark.observe` expects.
    `ack_ids` acknowledge the drained messages, once their samples are persisted.
    """

    samples: list[TrackingSample]
    caught_up: bool
    tracked_through_ms: int | None
    ack_ids: list[str]


class TrackingDrainer:
    """Drains a tracking subscription with short synchronous pulls; `ack` acknowledges a drain's messages.

    A drain pulls until a pull comes back empty (caught up) or `max_messages` were taken (not caught up: the
    rest waits for the next drain). The caller persists the samples, then acks: a sample acked but never saved
    (a run killed in between) would leave the emulator's backlog estimate without a message still waiting in the
    base subscription, and the watermark could pass it. A drain redelivered after a crash is observed again,
    which only holds the watermark back.

    On the emulator an empty pull means the subscription is empty. Google Cloud Pub/Sub may answer a pull with no
    messages while some are waiting, so there `tracked_through_ms` is itself an estimate.
    """

    def __init__(
        self,
        client: PubSubClient,
        subscription: str,
        timestamp_attribute: str | None,
        *,
        max_per_pull: int = 1_000,
        max_messages: int = 100_000,
        pull_timeout_s: float = 1.0,
    ) -> None:
        self.client = client
        self.subscription = subscription
        self.timestamp_attribute = timestamp_attribute
        self.max_per_pull = max_per_pull
        self.max_messages = max_messages
        self.pull_timeout_s = pull_timeout_s

    @classmethod
    def for_source(cls, client: PubSubClient, spec: PubSubSource) -> TrackingDrainer:
        """The drainer of a declared Pub/Sub source's tracking subscription."""
        return cls(client, spec.tracking, spec.timestamp_attribute)

    def drain(self, now_ms: int) -> TrackingDrain:
        """Drain the subscription (nothing is acknowledged yet); `now_ms` is the time the drain starts."""
        samples: list[TrackingSample] = []
        ack_ids: list[str] = []
        while len(samples) < self.max_messages:
            wanted = min(self.max_per_pull, self.max_messages - len(samples))
            pulled = self.client.pull(self.subscription, wanted, self.pull_timeout_s)
            if not pulled:
                return TrackingDrain(samples, caught_up=True, tracked_through_ms=now_ms, ack_ids=ack_ids)
            ack_ids.extend(m.ack_id for m in pulled)
            samples.extend(sample_of(m, self.timestamp_attribute) for m in pulled)
        return TrackingDrain(samples, caught_up=False, tracked_through_ms=None, ack_ids=ack_ids)

    def ack(self, drain: TrackingDrain) -> None:
        self.client.ack(self.subscription, drain.ack_ids)
