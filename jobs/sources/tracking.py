"""The tracking subscription: drained continuously, acked at once, kept only as watermark samples.

Each message on a Pub/Sub source's metadata-only tracking subscription becomes a `TrackingSample` (message id,
publish time, event time) for `PubSubWatermark` and its backlog probe. Nothing else is kept: the data itself is
landed from the base subscription.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from onceflow.jobs.declare.sources import PubSubSource
from onceflow.resources.pubsub import DRAINED_PULL_TIMEOUT_S, PubSubClient, PulledMessage
from onceflow.resources.pubsub_pull import PullBounds

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
    """What one drain of the tracking subscription, begun at `started_ms`, saw.

    A drain ends on an empty pull. When every pull answered (`caught_up`), everything published before the drain
    began has been seen, so `tracked_through_ms` is `started_ms`, as `PubSubWatermark.observe` expects. A pull cut
    off by its timeout may have been leased messages that never arrived: they stay out of sight until their ack
    deadline runs out, so such a drain proves nothing and `tracked_through_ms` is None (the drain stays open in
    the backlog probe and the watermark holds). `ack_ids` acknowledge the drained messages, once their samples
    are persisted.
    """

    samples: list[TrackingSample]
    started_ms: int
    caught_up: bool
    ack_ids: list[str]

    @property
    def tracked_through_ms(self) -> int | None:
        return self.started_ms if self.caught_up else None


class TrackingDrainer:
    """Drains a tracking subscription with `streams` short synchronous pulls in flight, holding a lease on what it
    pulled (`ack_deadline_s`, the subscription's); `ack` acknowledges a drain's messages.

    A drain pulls until a pull comes back empty, however many messages that takes: a drain cut short at a message
    budget could not say it was caught up, and a topic busier than the budget per batch would hold the watermark
    back for ever. The caller persists the samples, then acks: a sample acked but never saved (a run killed in
    between) would leave the emulator's backlog estimate without a message still waiting in the base
    subscription, and the watermark could pass it. A drain redelivered after a crash is observed again, which
    only holds the watermark back. The lease matters on a big backlog: a drain longer than the ack deadline would
    otherwise be shown its first messages again, and again, and never come to an empty pull.

    On the emulator an empty pull means the subscription is empty. Google Cloud Pub/Sub may answer a pull with no
    messages while some are waiting, so there `tracked_through_ms` is itself an estimate.
    """

    def __init__(
        self,
        client: PubSubClient,
        subscription: str,
        timestamp_attribute: str | None,
        *,
        streams: int = 1,
        ack_deadline_s: int = 60,
        pull_timeout_s: float = DRAINED_PULL_TIMEOUT_S,
    ) -> None:
        self.client = client
        self.subscription = subscription
        self.timestamp_attribute = timestamp_attribute
        self.streams = streams
        self.ack_deadline_s = ack_deadline_s
        self.pull_timeout_s = pull_timeout_s

    @classmethod
    def for_source(cls, client: PubSubClient, spec: PubSubSource) -> TrackingDrainer:
        """The drainer of a declared Pub/Sub source's tracking subscription."""
        return cls(
            client, spec.tracking, spec.timestamp_attribute, streams=spec.pull_streams or 1,
            ack_deadline_s=spec.ack_deadline_s or 60,
        )

    def drain(self, now_ms: int) -> TrackingDrain:
        """Drain the subscription (nothing is acknowledged yet); `now_ms` is the time the drain starts."""
        bounds = PullBounds(streams=self.streams)
        with self.client.pull_batch(self.subscription, bounds, self.ack_deadline_s, self.pull_timeout_s) as batch:
            samples = [sample_of(m, self.timestamp_attribute) for m in batch.messages]
        return TrackingDrain(samples, now_ms, batch.caught_up, ack_ids=batch.ack_ids)

    def ack(self, drain: TrackingDrain) -> None:
        self.client.ack(self.subscription, drain.ack_ids, streams=self.streams)
