"""Google Cloud Pub/Sub, through the official client with synchronous pull.

`PubSubClient` pulls a bounded batch while a background lease keeps every held message's ack deadline extended,
and acks only when told to: the caller persists the batch first. With `PUBSUB_EMULATOR_HOST` set the client
talks to the emulator; otherwise to Google Cloud with Application Default Credentials.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import dagster as dg
import grpc
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

# The emulator answers an empty pull about 1 s before the client timeout; a short timeout keeps polling quick.
EMPTY_PULL_TIMEOUT_S = 2.0
MAX_PULL = 1000
DRAINED_PULL_TIMEOUT_S = 0.25


@dataclass(frozen=True)
class PulledMessage:
    message_id: str
    publish_time_ms: int
    attributes: dict[str, str]
    data: bytes
    ack_id: str


@dataclass
class PulledBatch:
    """Messages pulled and held under lease: not acked until `PubSubClient.ack` is called."""

    messages: list[PulledMessage] = field(default_factory=list)

    @property
    def ack_ids(self) -> list[str]:
        return [m.ack_id for m in self.messages]


class PubSubClient:
    """Topic and subscription management, bounded synchronous pulls, lease extension and acks."""

    def __init__(self, project: str, emulator_host: str | None = None) -> None:
        self.project = project
        self.emulated = emulator_host is not None
        if emulator_host is None:
            self.publisher = pubsub_v1.PublisherClient()
            self.subscriber = pubsub_v1.SubscriberClient()
        else:
            # The library's own emulator channel keeps gRPC's 4 MiB receive limit, so a message Pub/Sub accepts
            # (up to 10 MB) could never be pulled: a poison message. This channel takes any size.
            self.publisher = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=_channel(emulator_host)))
            self.subscriber = pubsub_v1.SubscriberClient(
                transport=SubscriberGrpcTransport(channel=_channel(emulator_host))
            )

    def topic_path(self, topic: str) -> str:
        return self.publisher.topic_path(self.project, topic)

    def subscription_path(self, subscription: str) -> str:
        return self.subscriber.subscription_path(self.project, subscription)

    def ensure_topic(self, topic: str) -> None:
        with suppress(gexc.AlreadyExists):
            self.publisher.create_topic(name=self.topic_path(topic))

    def ensure_subscriptions(self, topic: str, subscriptions: Sequence[str], ack_deadline_s: int = 60) -> None:
        """Create the topic and its subscriptions together (a subscription created later misses earlier data)."""
        self.ensure_topic(topic)
        for name in subscriptions:
            with suppress(gexc.AlreadyExists):
                self.subscriber.create_subscription(
                    name=self.subscription_path(name),
                    topic=self.topic_path(topic),
                    ack_deadline_seconds=ack_deadline_s,
                )

    def pull(self, subscription: str, max_messages: int, timeout_s: float = EMPTY_PULL_TIMEOUT_S) -> list[PulledMessage]:
        """One synchronous pull; an empty list when nothing arrived before the timeout."""
        try:
            response = self.subscriber.pull(
                request={"subscription": self.subscription_path(subscription), "max_messages": max_messages},
                timeout=timeout_s,
                retry=None,
            )
        except gexc.DeadlineExceeded:
            return []
        return [
            PulledMessage(
                message_id=r.message.message_id,
                publish_time_ms=int(r.message.publish_time.timestamp() * 1000),
                attributes=dict(r.message.attributes),
                data=bytes(r.message.data),
                ack_id=r.ack_id,
            )
            for r in response.received_messages
        ]

    def has_messages(self, subscription: str, timeout_s: float = 2.0) -> bool:
        """Whether the subscription has a message to deliver: pull one and hand it straight back (ack deadline
        0, so it is redelivered at once). Only a hint for scheduling; it changes no data."""
        pulled = self.pull(subscription, 1, timeout_s)
        if pulled:
            self.modify_ack_deadline(subscription, [m.ack_id for m in pulled], 0)
        return bool(pulled)

    @contextmanager
    def pull_batch(
        self, subscription: str, max_messages: int, max_seconds: float, ack_deadline_s: int = 60
    ) -> Iterator[PulledBatch]:
        """Pull until `max_messages`, `max_seconds` or the subscription is drained, holding a lease on them.

        The lease extends each held message's ack deadline every half deadline until the block exits, so a slow
        persist does not let the messages be redelivered while they are being written.
        """
        batch = PulledBatch()
        stop = threading.Event()
        lock = threading.Lock()

        def extend() -> None:
            while not stop.wait(ack_deadline_s / 2):
                with lock:
                    ack_ids = batch.ack_ids
                self.modify_ack_deadline(subscription, ack_ids, ack_deadline_s)

        lease = threading.Thread(target=extend, name=f"lease-{subscription}", daemon=True)
        lease.start()
        try:
            deadline = time.monotonic() + max_seconds
            timeout = EMPTY_PULL_TIMEOUT_S
            while len(batch.messages) < max_messages and time.monotonic() < deadline:
                wanted = min(MAX_PULL, max_messages - len(batch.messages))
                pulled = self.pull(subscription, wanted, timeout)
                if not pulled:
                    break
                with lock:
                    batch.messages.extend(pulled)
                if len(pulled) < wanted:
                    # What was waiting has come: the pull that confirms the drain need not wait long.
                    timeout = DRAINED_PULL_TIMEOUT_S
            yield batch
        finally:
            stop.set()
            lease.join()

    def modify_ack_deadline(self, subscription: str, ack_ids: Sequence[str], seconds: int) -> None:
        for chunk in _chunks(ack_ids, 1000):
            self.subscriber.modify_ack_deadline(
                request={
                    "subscription": self.subscription_path(subscription),
                    "ack_ids": list(chunk),
                    "ack_deadline_seconds": seconds,
                }
            )

    def ack(self, subscription: str, ack_ids: Sequence[str]) -> None:
        for chunk in _chunks(ack_ids, 1000):
            self.subscriber.acknowledge(
                request={"subscription": self.subscription_path(subscription), "ack_ids": list(chunk)}
            )

    def publish(self, topic: str, messages: Sequence[tuple[bytes, dict[str, str]]]) -> list[str]:
        """Publish and wait; returns the message ids in order."""
        path = self.topic_path(topic)
        futures = [self.publisher.publish(path, data, **attributes) for data, attributes in messages]
        return [f.result(timeout=60) for f in futures]


def _channel(host: str) -> grpc.Channel:
    return grpc.insecure_channel(
        host, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    )


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class PubSubResource(dg.ConfigurableResource):
    """The Pub/Sub project; `emulator_host` is the emulator's address (`PUBSUB_EMULATOR_HOST`), None on GCP."""

    project: str = "onceflow-local"
    emulator_host: str | None = None

    def client(self) -> PubSubClient:
        return PubSubClient(self.project, self.emulator_host)
