"""The tracking subscription on Google's Pub/Sub emulator: drained, acked, turned into watermark samples."""

from __future__ import annotations

import time

import pytest

from onceflow.jobs.sources.backlog import EmulatorBacklogProbe
from onceflow.jobs.sources.tracking import TrackingDrainer, parse_event_time_ms, sample_of
from onceflow.jobs.sources.watermark import PubSubWatermark
from onceflow.resources.emulators.pubsub import PubSubEmulator
from onceflow.resources.pubsub import PubSubClient, PulledMessage
from tests.pipelines import SUBSCRIPTION, TOPIC, TRACKING, events_pipeline, new_project

START_MS = 1_763_720_000_000  # 2025-11-21T10:13:20Z


def make_client(ack_deadline_s: int = 60) -> PubSubClient:
    """A fresh project with the topic and both subscriptions, created before anything is published."""
    client = PubSubClient(new_project())
    client.ensure_subscriptions(TOPIC, [SUBSCRIPTION, TRACKING], ack_deadline_s)
    return client


def pull_all(client: PubSubClient, subscription: str) -> list[PulledMessage]:
    messages: list[PulledMessage] = []
    while pulled := client.pull(subscription, 1_000, 1.0):
        messages.extend(pulled)
    return messages


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1763720000456", 1_763_720_000_456),
        ("-1500", -1_500),
        ("2025-11-21T10:13:20.123Z", 1_763_720_000_123),
        ("2025-11-21t10:13:20.123456789z", 1_763_720_000_123),
        ("2025-11-21T12:13:20+02:00", 1_763_720_000_000),
        ("2025-11-21T10:13:20", 1_763_720_000_000),
        ("yesterday", None),
        ("", None),
        ("1234567890123456", None),
        (None, None),
    ],
)
def test_parse_event_time(raw: str | None, expected: int | None) -> None:
    assert parse_event_time_ms(raw) == expected


def test_sample_falls_back_to_the_publish_time() -> None:
    def message(attributes: dict[str, str]) -> PulledMessage:
        return PulledMessage("7", START_MS + 9, attributes, b"{}", "ack")

    assert sample_of(message({"event_time": "1000"}), "event_time").event_time_ms == 1_000
    assert sample_of(message({"event_time": "soon"}), "event_time").event_time_ms == START_MS + 9
    assert sample_of(message({}), "event_time").event_time_ms == START_MS + 9
    assert sample_of(message({"event_time": "1000"}), None).event_time_ms == START_MS + 9


def test_drain_samples_every_message_and_acks_only_when_told(pubsub_emulator: PubSubEmulator) -> None:
    client = make_client(ack_deadline_s=10)
    attributes = [
        {"event_id": "rfc", "event_time": "2025-11-21T10:13:20.123Z"},
        {"event_id": "millis", "event_time": "1763720000456"},
        {"event_id": "missing"},
        {"event_id": "bad", "event_time": "yesterday"},
    ]
    ids = client.publish(TOPIC, [(b"{}", a) for a in attributes])
    drainer = TrackingDrainer.for_source(client, events_pipeline().source)  # type: ignore[arg-type]
    now_ms = int(time.time() * 1000)

    drain = drainer.drain(now_ms)

    assert drain.tracked_through_ms == now_ms
    by_id = {s.message_id: s for s in drain.samples}
    assert sorted(by_id) == sorted(ids) and len(drain.samples) == 4
    rfc, millis, missing, bad = (by_id[i] for i in ids)
    assert rfc.event_time_ms == START_MS + 123
    assert millis.event_time_ms == START_MS + 456
    assert missing.event_time_ms == missing.publish_time_ms
    assert bad.event_time_ms == bad.publish_time_ms
    assert all(now_ms - 60_000 < s.publish_time_ms <= now_ms for s in drain.samples)
    # Not acked by the drain (its samples are not persisted yet): past the ack deadline they come back.
    time.sleep(11)
    again = drainer.drain(now_ms + 1)
    assert sorted(s.message_id for s in again.samples) == sorted(ids)
    drainer.ack(again)
    time.sleep(11)  # acked now: past the ack deadline, nothing is back
    assert drainer.drain(now_ms + 2).samples == []
    # The base subscription sees the very same messages: same ids, same publish times.
    base = pull_all(client, SUBSCRIPTION)
    assert {(m.message_id, m.publish_time_ms) for m in base} == {
        (s.message_id, s.publish_time_ms) for s in drain.samples
    }


def publish_many(client: PubSubClient, topic: str, messages: list[tuple[bytes, dict[str, str]]]) -> list[str]:
    """Publish in requests of 1,000 messages (the batching publisher sends 100 at a time): a big backlog, quickly."""
    path, ids = client.topic_path(topic), []
    for start in range(0, len(messages), 1_000):
        chunk = [{"data": data, "attributes": attributes} for data, attributes in messages[start : start + 1_000]]
        ids.extend(client.publisher.api.publish(request={"topic": path, "messages": chunk}).message_ids)
    return ids


def test_one_drain_takes_a_backlog_past_the_old_cap(pubsub_emulator: PubSubEmulator) -> None:
    # The old drain stopped at 100,000 messages and could not say it had caught up: on a topic busier than that per
    # batch the watermark could never pass what it had not seen. Now one drain takes the whole backlog, under a
    # lease: on a loaded machine it outlasts the 20 s ack deadline, and without one it would be shown its first
    # messages again and again.
    client = PubSubClient(new_project())
    ack_deadline_s = 20
    client.ensure_subscriptions(TOPIC, [TRACKING], ack_deadline_s)
    count = 100_250
    ids = publish_many(client, TOPIC, [(b"", {"event_time": str(START_MS + i)}) for i in range(count)])
    drainer = TrackingDrainer(client, TRACKING, "event_time", ack_deadline_s=ack_deadline_s)

    drains = [drainer.drain(START_MS + count)]
    while not drains[-1].caught_up and len(drains) < 4:
        # Under load a pull can be cut off by its timeout: it does not claim the drain caught up, and what the
        # server leased to it comes back once the ack deadline runs out.
        drainer.ack(drains[-1])
        time.sleep(ack_deadline_s + 1)
        drains.append(drainer.drain(START_MS + count + len(drains)))

    assert drains[-1].caught_up and drains[-1].tracked_through_ms == drains[-1].started_ms
    assert all(d.tracked_through_ms is None for d in drains[:-1])
    samples = [s for d in drains for s in d.samples]
    assert len(samples) == count and sorted(s.message_id for s in samples) == sorted(ids)
    assert sorted(s.event_time_ms for s in samples) == [START_MS + i for i in range(count)]
    drainer.ack(drains[-1])
    assert drainer.drain(START_MS + count + 9).samples == []


class FirstPullCutOff(PubSubClient):
    """The fault a loaded server causes: its first pull is leased messages but cut off by its timeout before the
    answer arrives (the messages are really leased on the emulator, and never seen)."""

    cut = False

    def pull_answer(self, subscription: str, max_messages: int, timeout_s: float) -> list[PulledMessage] | None:
        answer = super().pull_answer(subscription, max_messages, timeout_s)
        if self.cut:
            return answer
        self.cut = True
        return None


def test_a_drain_with_a_pull_cut_off_proves_nothing_and_holds_the_watermark(pubsub_emulator: PubSubEmulator) -> None:
    ack_deadline_s = 10
    client = make_client(ack_deadline_s)
    client.publish(TOPIC, [(b"{}", {"event_id": "e0", "event_time": str(START_MS)})])
    band = 60_000
    watermark = PubSubWatermark(EmulatorBacklogProbe(), band_ms=band, idle_timeout_ms=band, bucket_ms=1)
    now_ms = int(time.time() * 1000)
    watermark.drain_begun(now_ms)
    drainer = TrackingDrainer(client, TRACKING, "event_time")
    drain = drainer.drain(now_ms)
    watermark.observe(drain.samples, drain.tracked_through_ms)
    drainer.ack(drain)
    base = pull_all(client, SUBSCRIPTION)
    client.ack(SUBSCRIPTION, [m.ack_id for m in base])
    watermark.committed((m.message_id, m.publish_time_ms) for m in base)
    assert drain.caught_up and watermark.current(now_ms) == START_MS

    # e1 waits in the base subscription; the tracking drain's pull that was leased it never got the answer.
    client.publish(TOPIC, [(b"{}", {"event_id": "e1", "event_time": str(START_MS + 1_000)})])
    cut_client = FirstPullCutOff(client.project)
    later = now_ms + 300_000
    watermark.drain_begun(later)
    cut = TrackingDrainer(cut_client, TRACKING, "event_time").drain(later)
    assert cut.samples == [] and not cut.caught_up and cut.tracked_through_ms is None
    watermark.observe(cut.samples, cut.tracked_through_ms)
    # Taken as caught up, the drain would let the idle rule carry the watermark to `later`, past e1.
    assert watermark.current(later + band) == START_MS

    # Once the lease runs out a caught-up drain sees e1, which holds the watermark while it waits.
    time.sleep(ack_deadline_s + 1)
    last = later + 200_000
    watermark.drain_begun(last)
    drain = drainer.drain(last)
    watermark.observe(drain.samples, drain.tracked_through_ms)
    assert drain.caught_up and [s.event_time_ms for s in drain.samples] == [START_MS + 1_000]
    assert watermark.current(last + band) == START_MS + 1_000


def test_watermark_from_the_emulator(pubsub_emulator: PubSubEmulator) -> None:
    client = make_client()
    # Events from a while ago, published now and out of order.
    order = [3, 0, 4, 1, 2]
    ids = client.publish(
        TOPIC, [(b"{}", {"event_id": f"e{i}", "event_time": str(START_MS + 1_000 * i)}) for i in order]
    )
    event_of = {message_id: START_MS + 1_000 * i for message_id, i in zip(ids, order, strict=True)}
    band = 60_000
    watermark = PubSubWatermark(EmulatorBacklogProbe(), band_ms=band, bucket_ms=1)
    drainer = TrackingDrainer(client, TRACKING, "event_time")
    now_ms = int(time.time() * 1000)

    drain = drainer.drain(now_ms)
    watermark.observe(drain.samples, drain.tracked_through_ms)
    publish_of = {s.message_id: s.publish_time_ms for s in drain.samples}
    assert {s.message_id: s.event_time_ms for s in drain.samples} == event_of
    # Everything is still waiting in the base subscription: the earliest event time holds the watermark.
    assert watermark.current(now_ms) == START_MS

    # The pipeline lands the base subscription's messages and commits those of events 3 and 4.
    base = pull_all(client, SUBSCRIPTION)
    assert sorted(m.message_id for m in base) == sorted(ids)
    done = [m for m in base if event_of[m.message_id] >= START_MS + 3_000]
    client.ack(SUBSCRIPTION, [m.ack_id for m in done])
    watermark.committed((m.message_id, m.publish_time_ms) for m in done)
    waiting = [i for i in ids if event_of[i] < START_MS + 3_000]
    oldest = min(publish_of[i] for i in waiting)
    assert watermark.probe.oldest_unacked_ms(now_ms) == oldest

    # Two minutes on, a new drain finds nothing: T moves on, B stays at the oldest waiting message.
    later = now_ms + 120_000
    drain = drainer.drain(later)
    assert drain.samples == [] and drain.tracked_through_ms == later
    watermark.observe(drain.samples, drain.tracked_through_ms)
    in_range = [event_of[i] for i, p in publish_of.items() if oldest <= p <= later]
    assert watermark.current(later) == max(START_MS, min([oldest, *in_range]))

    # Everything is committed: no backlog, and two more quiet minutes advance it to near real time.
    rest = [m for m in base if m not in done]
    client.ack(SUBSCRIPTION, [m.ack_id for m in rest])
    watermark.committed((m.message_id, m.publish_time_ms) for m in rest)
    assert watermark.probe.oldest_unacked_ms(later) is None
    # Not idle yet (the backlog was last seen at `later`), but with no sample left in [T - band, T] the
    # watermark is that range's lower bound.
    assert watermark.current(later + 120_000 - 1) == later - band
    assert watermark.current(later + 120_000) == later + 120_000 - band
    assert watermark.to_state()["probe"]["pending"] == []
