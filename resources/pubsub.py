"""Google Cloud Pub/Sub, through the official client with synchronous pulls (several in flight at once).

`PubSubClient` pulls a batch bounded in messages, bytes and time while a background lease keeps every held
message's ack deadline extended, and acks only when told to: the caller persists the batch first. With
`PUBSUB_EMULATOR_HOST` set the client talks to the emulator; otherwise to Google Cloud with Application Default
Credentials.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import dagster as dg
import grpc
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from onceflow.resources.pubsub_pull import (
    CONFIRMING,
    FLOWING,
    SHORT,
    PullBounds,
    PullOutcome,
    pull_concurrently,
)

# Google Cloud Pub/Sub long-polls: an empty pull waits up to its timeout, so a short one keeps polling quick. Once
# a pull came back short, later ones wait less, but not much less: a pull among several in flight on a busy machine
# can be slow to answer, and one cut off by its timeout strands what it was given until the ack deadline.
EMPTY_PULL_TIMEOUT_S = 2.0
DRAINED_PULL_TIMEOUT_S = 1.5
CONFIRM_PULL_TIMEOUT_S = 1.0
# The emulator holds an empty pull until about a second before its timeout, and on a loaded machine lets it run
# out: a timed-out pull that held nothing could not be told from one cut off with messages. Asked to answer at
# once (`return_immediately`, deprecated on Google Cloud, honoured by the emulator) it answers an empty pull in
# milliseconds, so there every pull gets a long timeout, and one that runs out means the emulator really stalled.
EMULATOR_PULL_TIMEOUT_S = 10.0
ACK_CHUNK = 1000  # ack ids per acknowledge / modify-ack-deadline request


@dataclass(frozen=True)
class PulledMessage:
    message_id: str
    publish_time_ms: int
    attributes: dict[str, str]
    data: bytes
    ack_id: str

    @property
    def size(self) -> int:
        """The bytes it brings into a batch: its data and attributes (what `max_bytes` bounds)."""
        return len(self.data) + sum(len(k) + len(v) for k, v in self.attributes.items())


@dataclass
class PulledBatch:
    """Messages pulled and held under lease: not acked until `PubSubClient.ack` is called. `caught_up`: the pull
    emptied the subscription with every answer seen (`PullOutcome.caught_up`)."""

    messages: list[PulledMessage] = field(default_factory=list)
    caught_up: bool = False

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
        return self.pull_answer(subscription, max_messages, timeout_s) or []

    def pull_answer(self, subscription: str, max_messages: int, timeout_s: float) -> list[PulledMessage] | None:
        """One synchronous pull; None when it was cut off by its timeout (the server may have leased messages to
        it that never arrived: they come back once their ack deadline runs out). The emulator answers at once, with
        `EMULATOR_PULL_TIMEOUT_S` as the timeout."""
        request = {"subscription": self.subscription_path(subscription), "max_messages": max_messages}
        if self.emulated:
            request["return_immediately"] = True
            timeout_s = EMULATOR_PULL_TIMEOUT_S
        try:
            response = self.subscriber.pull(request=request, timeout=timeout_s, retry=None)
        except gexc.DeadlineExceeded:
            return None
        # The plain protobuf, not the proto-plus wrapper: its per-field conversions cost more than the pull itself.
        return [
            PulledMessage(
                message_id=r.message.message_id,
                publish_time_ms=r.message.publish_time.ToMilliseconds(),
                attributes=dict(r.message.attributes),
                data=r.message.data,
                ack_id=r.ack_id,
            )
            for r in type(response).pb(response).received_messages
        ]

    def has_messages(self, subscription: str, timeout_s: float = 2.0) -> bool:
        """Whether the subscription has a message to deliver: pull one and hand it straight back (ack deadline
        0, so it is redelivered at once). Only a hint for scheduling; it changes no data."""
        pulled = self.pull(subscription, 1, timeout_s)
        if pulled:
            self.modify_ack_deadline(subscription, [m.ack_id for m in pulled], 0)
        return bool(pulled)

    def pull_concurrently(
        self,
        subscription: str,
        bounds: PullBounds,
        kept: Callable[[list[PulledMessage]], None] = lambda _: None,
        timeout_s: float = EMPTY_PULL_TIMEOUT_S,
    ) -> PullOutcome[PulledMessage]:
        """Pull with `bounds.streams` requests in flight until a bound is reached or the subscription is drained
        (`onceflow.resources.pubsub_pull`); what came beyond the bounds goes straight back to the subscription. Each pull
        waits up to `timeout_s`, or less once one came back short. The outcome's `kept` are the messages."""
        timeouts = {FLOWING: timeout_s, SHORT: min(timeout_s, DRAINED_PULL_TIMEOUT_S), CONFIRMING: CONFIRM_PULL_TIMEOUT_S}

        def pull(wanted: int, stage: int) -> list[PulledMessage] | None:
            return self.pull_answer(subscription, wanted, timeouts[stage])

        def give_back(messages: list[PulledMessage]) -> None:
            self.modify_ack_deadline(subscription, [m.ack_id for m in messages], 0)

        return pull_concurrently(pull, bounds, kept, give_back)

    @contextmanager
    def pull_batch(
        self, subscription: str, bounds: PullBounds, ack_deadline_s: int = 60, timeout_s: float = EMPTY_PULL_TIMEOUT_S
    ) -> Iterator[PulledBatch]:
        """Pull until a bound of `bounds` is reached or the subscription is drained, holding a lease on what was
        kept (`pull_concurrently`; the batch says whether it `caught_up`).

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
                self.modify_ack_deadline(subscription, ack_ids, ack_deadline_s, streams=bounds.streams)

        def hold(messages: list[PulledMessage]) -> None:
            with lock:
                batch.messages.extend(messages)

        lease = threading.Thread(target=extend, name=f"lease-{subscription}", daemon=True)
        lease.start()
        try:
            batch.caught_up = self.pull_concurrently(subscription, bounds, hold, timeout_s).caught_up
            yield batch
        finally:
            stop.set()
            lease.join()

    def modify_ack_deadline(self, subscription: str, ack_ids: Sequence[str], seconds: int, streams: int = 1) -> None:
        path = self.subscription_path(subscription)
        _each_chunk(
            ack_ids,
            lambda chunk: self.subscriber.modify_ack_deadline(
                request={"subscription": path, "ack_ids": chunk, "ack_deadline_seconds": seconds}
            ),
            streams,
        )

    def ack(self, subscription: str, ack_ids: Sequence[str], streams: int = 1) -> None:
        """Acknowledge, in requests of `ACK_CHUNK` ids, `streams` of them at once."""
        path = self.subscription_path(subscription)
        _each_chunk(ack_ids, lambda chunk: self.subscriber.acknowledge(request={"subscription": path, "ack_ids": chunk}), streams)

    def publish(self, topic: str, messages: Sequence[tuple[bytes, dict[str, str]]]) -> list[str]:
        """Publish and wait; returns the message ids in order."""
        path = self.topic_path(topic)
        futures = [self.publisher.publish(path, data, **attributes) for data, attributes in messages]
        return [f.result(timeout=60) for f in futures]


def _channel(host: str) -> grpc.Channel:
    return grpc.insecure_channel(
        host, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    )


def _each_chunk(ack_ids: Sequence[str], call: Callable[[list[str]], object], streams: int) -> None:
    chunks = [list(ack_ids[start : start + ACK_CHUNK]) for start in range(0, len(ack_ids), ACK_CHUNK)]
    if streams <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            call(chunk)
        return
    with ThreadPoolExecutor(min(streams, len(chunks)), thread_name_prefix="ack") as pool:
        list(pool.map(call, chunks))


class PubSubResource(dg.ConfigurableResource):
    """The Pub/Sub project; `emulator_host` is the emulator's address (`PUBSUB_EMULATOR_HOST`), None on GCP."""

    project: str = "onceflow-local"
    emulator_host: str | None = None

    def client(self) -> PubSubClient:
        return PubSubClient(self.project, self.emulator_host)
