"""Watermarks with an injected clock: exact values, lateness, idle advance, monotonicity, persistence, bounds."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, Self

import pytest

from onceflow.jobs.sources.backlog import (
    BacklogProbe,
    BacklogUnknown,
    EmulatorBacklogProbe,
    MessageKey,
    ReadsBacklogElsewhere,
)
from onceflow.jobs.sources.cloud_backlog import CloudMonitoringBacklogProbe
from onceflow.jobs.sources.kafka_watermark import KafkaWatermark
from onceflow.jobs.sources.tracking import TrackingSample
from onceflow.jobs.sources.watermark import FileWatermark, PubSubWatermark, WatermarkEstimator

T0 = 1_763_720_000_000  # 2025-11-21T10:13:20Z, a whole second
BAND = 10_000
IDLE = 120_000


@dataclass(frozen=True)
class Msg:
    id: str
    publish_ms: int
    event_ms: int

    def sample(self) -> TrackingSample:
        return TrackingSample(self.id, self.publish_ms, self.event_ms)

    @property
    def key(self) -> MessageKey:
        return (self.id, self.publish_ms)


@dataclass
class Run:
    late: list[str] = field(default_factory=list)
    watermarks: list[int | None] = field(default_factory=list)


def stream(seconds: int, delay_ms: Iterable[int], every_ms: int = 250) -> list[Msg]:
    """One message every `every_ms` after T0; message i's event time is its publish time minus delay i."""
    delays = iter(delay_ms)
    return [
        Msg(f"m{i}", T0 + i * every_ms, T0 + i * every_ms - next(delays))
        for i in range(1, seconds * 1000 // every_ms + 1)
    ]


def simulate(
    messages: list[Msg], ticks: int, base_lag_ms: int = 0, round_trip: bool = False, band_ms: int = BAND
) -> Run:
    """One micro-batch per second, in the order the wiring uses.

    At tick `now`: drain the tracking subscription (everything published up to `now`); the base subscription
    commits what was published up to `now - base_lag_ms` — a record is late if its event time is before the
    watermark of the previous tick, the one windows were closed with while it was still on its way; report the
    commit; compute the watermark. With `round_trip`, the estimator is rebuilt from its JSON state every tick.
    """

    def fresh() -> PubSubWatermark:
        return PubSubWatermark(EmulatorBacklogProbe(), band_ms=band_ms)

    watermark = fresh()
    run = Run()
    tracked: set[str] = set()
    committed: set[str] = set()
    previous: int | None = None
    for tick in range(1, ticks + 1):
        now = T0 + tick * 1000
        new = [m for m in messages if m.publish_ms <= now and m.id not in tracked]
        watermark.observe([m.sample() for m in new], now)
        tracked.update(m.id for m in new)
        batch = [m for m in messages if m.publish_ms <= now - base_lag_ms and m.id not in committed]
        run.late.extend(m.id for m in batch if previous is not None and m.event_ms < previous)
        watermark.committed(m.key for m in batch)
        committed.update(m.id for m in batch)
        previous = watermark.current(now)
        run.watermarks.append(previous)
        if round_trip:
            watermark = fresh().from_state(json.loads(json.dumps(watermark.to_state())))
    return run


def reference_watermarks(messages: list[Msg], ticks: int, band_ms: int = BAND) -> list[int | None]:
    """The watermark by brute force when the base subscription keeps up (B = T, T = now, 1 s buckets)."""
    out: list[int | None] = []
    previous: int | None = None
    for tick in range(1, ticks + 1):
        now = T0 + tick * 1000
        if any(m.publish_ms <= now for m in messages):
            low = now - band_ms
            value = min([low] + [m.event_ms for m in messages if low <= m.publish_ms <= now])
            previous = value if previous is None else max(previous, value)
        out.append(previous)
    return out


class FakeProbe(ReadsBacklogElsewhere):
    """A backlog probe whose answer the test sets."""

    def __init__(self) -> None:
        self.oldest: int | None = None

    def oldest_unacked_ms(self, now_ms: int) -> int | None:
        return self.oldest

    def to_state(self) -> dict[str, Any]:
        return {}

    def from_state(self, state: Mapping[str, Any]) -> Self:
        return self


def test_estimators_and_probes_implement_the_interfaces() -> None:
    assert isinstance(PubSubWatermark(EmulatorBacklogProbe()), WatermarkEstimator)
    assert isinstance(FileWatermark(30_000), WatermarkEstimator)
    assert isinstance(EmulatorBacklogProbe(), BacklogProbe)
    assert isinstance(CloudMonitoringBacklogProbe("p", "s", client=object()), BacklogProbe)
    assert isinstance(FakeProbe(), BacklogProbe)


def test_none_before_any_data() -> None:
    watermark = PubSubWatermark(EmulatorBacklogProbe())
    assert watermark.current(T0) is None
    watermark.observe([], T0)
    assert watermark.current(T0 + 10 * IDLE) is None
    assert watermark.to_state()["watermark_ms"] is None
    files = FileWatermark(30_000)
    files.observe(None, T0)
    assert files.current(T0 + 10 * IDLE) is None


def test_exact_value_is_min_event_time_in_range_capped_by_its_lower_bound() -> None:
    probe = FakeProbe()
    watermark = PubSubWatermark(probe)
    samples = [
        TrackingSample("a", T0 + 1_000, T0 - 4_000),  # before the range [T0 + 5 s, T0 + 15 s]: ignored
        TrackingSample("b", T0 + 6_000, T0 + 3_500),
        TrackingSample("c", T0 + 9_000, T0 + 2_000),
        TrackingSample("d", T0 + 16_000, T0 - 9_000),  # after T: not in range yet
    ]
    watermark.observe(samples, T0 + 15_000)
    assert watermark.current(T0 + 15_000) == T0 + 2_000
    # A base backlog reaching back to T0 + 1 s brings sample a into the range.
    probe.oldest = T0 + 1_000
    watermark.observe([], T0 + 16_000)
    # The minimum is now T0 - 4 s, but the watermark does not go back.
    assert watermark.current(T0 + 16_000) == T0 + 2_000
    # Without samples in range, the watermark is the range's lower bound T - band.
    probe.oldest = None
    fresh = PubSubWatermark(FakeProbe())
    fresh.observe([TrackingSample("x", T0, T0 + 50_000)], T0 + 30_000)
    assert fresh.current(T0 + 30_000) == T0 + 20_000
    # Samples in range with event times after T - band: capped by the lower bound.
    capped = PubSubWatermark(FakeProbe())
    capped.observe([TrackingSample("y", T0 + 29_000, T0 + 29_500)], T0 + 30_000)
    assert capped.current(T0 + 30_000) == T0 + 20_000


def test_reordering_within_the_band_is_never_late() -> None:
    rng = random.Random(5)
    delays = [BAND if i % 97 == 0 else rng.randint(0, BAND) for i in range(10_000)]
    messages = stream(120, delays)
    assert max(m.publish_ms - m.event_ms for m in messages) == BAND
    run = simulate(messages, 125)
    assert run.late == []
    assert run.watermarks == reference_watermarks(messages, 125)
    # Last tick: T = T0 + 125 s, the range is [T0 + 115 s, T0 + 125 s] and its earliest event time wins.
    assert run.watermarks[-1] == min(m.event_ms for m in messages if m.publish_ms >= T0 + 115_000)


def test_sparse_stream_within_the_band_is_never_late() -> None:
    # One message every 2 s on time, then one 9.5 s behind, published just after an odd-second tick. The minimum
    # event time in [T - band, T] alone would be T0 + 12 s at that tick (T = T0 + 21 s), past the late one's
    # T0 + 11.75 s; capping by the range's lower bound T - band keeps the watermark at T0 + 11 s.
    messages = [Msg(f"m{i}", T0 + 2_000 * i, T0 + 2_000 * i) for i in range(1, 31)]
    messages.append(Msg("edge", T0 + 21_250, T0 + 21_250 - 9_500))
    run = simulate(messages, 40)
    assert run.late == []
    assert run.watermarks[20] == T0 + 11_000
    assert run.watermarks == reference_watermarks(messages, 40)


def test_reordering_beyond_the_band_is_late_and_named() -> None:
    rng = random.Random(8)
    messages = stream(120, (rng.randint(0, 2_000) for _ in range(10_000)))
    messages += [
        Msg("beyond-a", T0 + 40_250, T0 + 40_250 - 15_000),
        Msg("beyond-b", T0 + 70_500, T0 + 70_500 - 13_000),
        Msg("band-edge", T0 + 90_250, T0 + 90_250 - BAND),
    ]
    run = simulate(messages, 125)
    assert run.late == ["beyond-a", "beyond-b"]
    assert all(b >= a for a, b in zip(run.watermarks, run.watermarks[1:], strict=False) if a is not None)


def test_base_backlog_holds_the_watermark_for_tracked_messages() -> None:
    rng = random.Random(9)
    messages = stream(120, (rng.randint(0, 2_000) for _ in range(10_000)))
    messages.append(Msg("slow", T0 + 50_250, T0 + 50_250 - 25_000))
    # The base subscription keeps up: "slow" was not tracked yet when the watermark passed its event time.
    assert simulate(messages, 125).late == ["slow"]
    # The base subscription lags 30 s: "slow" was tracked and pending, so B held the watermark below it.
    lagging = simulate(messages, 160, base_lag_ms=30_000)
    assert lagging.late == []
    # Tick 51: B = T0 + 21.25 s (the oldest uncommitted message); its 1 s bucket starts at T0 + 21 s.
    assert lagging.watermarks[50] == min(
        m.event_ms for m in messages if T0 + 21_000 <= m.publish_ms <= T0 + 51_000
    )


def test_idle_advance_exactly_at_the_timeout() -> None:
    watermark = PubSubWatermark(EmulatorBacklogProbe())
    message = Msg("1", T0, T0 - 3_000)
    watermark.observe([message.sample()], T0)
    watermark.committed([message.key])
    assert watermark.current(T0) == T0 - BAND
    assert watermark.current(T0 + IDLE - 1) == T0 - BAND
    assert watermark.current(T0 + IDLE) == T0 + IDLE - BAND
    assert watermark.current(T0 + IDLE + 30_000) == T0 + IDLE + 30_000 - BAND
    # New data re-arms the timeout from its publish time.
    later = Msg("2", T0 + 200_000, T0 + 199_000)
    watermark.observe([later.sample()], T0 + 200_000)
    watermark.committed([later.key])
    assert watermark.current(T0 + 200_000) == T0 + 190_000
    assert watermark.current(T0 + 200_000 + IDLE - 1) == T0 + 190_000
    assert watermark.current(T0 + 200_000 + IDLE) == T0 + 200_000 + IDLE - BAND


def test_no_idle_advance_while_there_is_backlog() -> None:
    watermark = PubSubWatermark(EmulatorBacklogProbe())
    message = Msg("1", T0, T0 - 3_000)
    watermark.observe([message.sample()], T0)
    assert watermark.current(T0 + IDLE) == T0 - BAND
    assert watermark.current(T0 + 300_000) == T0 - BAND  # still pending in the base subscription
    watermark.committed([message.key])
    # The backlog was last seen at T0 + 300 s: the idle timeout runs from there.
    assert watermark.current(T0 + 300_000 + IDLE - 1) == T0 - BAND
    assert watermark.current(T0 + 300_000 + IDLE) == T0 + 300_000 + IDLE - BAND


def test_never_moves_backward_when_the_backlog_jumps_back() -> None:
    probe = FakeProbe()
    watermark = PubSubWatermark(probe)
    watermark.observe(
        [TrackingSample(f"s{i}", T0 + i * 1_000, T0 + i * 1_000) for i in range(21)], T0 + 20_000
    )
    probe.oldest = T0 + 15_000
    assert watermark.current(T0 + 20_000) == T0 + 10_000
    probe.oldest = T0 + 2_000
    assert watermark.current(T0 + 21_000) == T0 + 10_000
    restored = PubSubWatermark(probe).from_state(json.loads(json.dumps(watermark.to_state())))
    assert restored.current(T0 + 22_000) == T0 + 10_000
    probe.oldest = None
    watermark.observe([], T0 + 40_000)
    assert watermark.current(T0 + 40_000) == T0 + 30_000


def test_state_round_trips_give_the_same_watermarks() -> None:
    rng = random.Random(3)
    messages = stream(60, (rng.randint(0, 14_000) for _ in range(10_000)))
    plain = simulate(messages, 200, base_lag_ms=5_000)
    persisted = simulate(messages, 200, base_lag_ms=5_000, round_trip=True)
    assert persisted.watermarks == plain.watermarks
    assert persisted.late == plain.late
    # After data stops (60 s), the idle rule takes over 120 s later: tick 180 is the first idle one.
    assert plain.watermarks[179] == T0 + 180_000 - BAND
    assert all(b >= a for a, b in zip(plain.watermarks, plain.watermarks[1:], strict=False) if a is not None)


def test_restoring_an_older_state_does_not_move_backward() -> None:
    watermark = PubSubWatermark(EmulatorBacklogProbe())
    first = Msg("1", T0, T0)
    watermark.observe([first.sample()], T0)
    watermark.committed([first.key])
    watermark.current(T0)
    old_state = json.loads(json.dumps(watermark.to_state()))
    second = Msg("2", T0 + 60_000, T0 + 60_000)
    watermark.observe([second.sample()], T0 + 60_000)
    watermark.committed([second.key])
    assert watermark.current(T0 + 60_000) == T0 + 50_000
    watermark.from_state(old_state)
    assert watermark.current(T0 + 60_000) == T0 + 50_000
    assert watermark.to_state()["watermark_ms"] == T0 + 50_000
    with pytest.raises(ValueError, match="kind 'files'"):
        watermark.from_state({"kind": "files"})


def test_file_watermark_bound_and_monotonic() -> None:
    files = FileWatermark(30_000)
    files.observe(T0 + 100_000, T0)
    assert files.current(T0) == T0 + 70_000
    files.observe(T0 + 90_000, T0 + 10_000)  # an older file: the max does not go back
    assert files.current(T0 + 10_000) == T0 + 70_000
    files.observe(T0 + 130_000, T0 + 20_000)
    assert files.current(T0 + 20_000) == T0 + 100_000
    restored = FileWatermark(30_000).from_state(json.loads(json.dumps(files.to_state())))
    assert restored.current(T0 + 20_000) == T0 + 100_000
    assert restored.to_state() == files.to_state()


def test_file_watermark_idle_rule() -> None:
    files = FileWatermark(30_000, idle_timeout_ms=IDLE)
    files.observe(T0 - 500_000, T0)
    assert files.current(T0 + IDLE - 1) == T0 - 530_000
    assert files.current(T0 + IDLE) == T0 + IDLE - 30_000
    # New files (here: waiting, no records yet) re-arm the timeout; the watermark keeps its value meanwhile.
    files.observe(None, T0 + 200_000)
    assert files.current(T0 + 200_000 + IDLE - 1) == T0 + IDLE - 30_000
    assert files.current(T0 + 200_000 + IDLE) == T0 + 200_000 + IDLE - 30_000
    # An old file after the idle advance: its records are late, and the watermark stays.
    files.observe(T0, T0 + 400_000)
    assert files.current(T0 + 400_000) == T0 + 200_000 + IDLE - 30_000


def test_histogram_is_pruned_to_the_band() -> None:
    watermark = PubSubWatermark(EmulatorBacklogProbe())
    counts: list[int] = []
    for second in range(1, 3_601):
        now = T0 + second * 1_000
        batch = [Msg(f"{second}.{k}", now - 1_000 + 100 * k + 100, now - 400 * k) for k in range(10)]
        watermark.observe([m.sample() for m in batch], now)
        watermark.acked(now)
        watermark.committed(m.key for m in batch)
        watermark.current(now)
        counts.append(watermark.bucket_count)
    # The buckets left are those overlapping [T - 10 s, T]: eleven one-second buckets.
    assert counts[:10] == list(range(2, 12))
    assert set(counts[10:]) == {11}
    state = watermark.to_state()
    assert [b[0] for b in state["buckets"]] == [T0 + 3_590_000 + 1_000 * i for i in range(11)]
    assert state["probe"]["pending"] == [] and state["probe"]["early"] == [] and state["probe"]["leased"] == []
    assert len(json.dumps(state)) < 1_000


def test_histogram_is_coarsened_under_a_long_backlog() -> None:
    watermark = PubSubWatermark(EmulatorBacklogProbe(), max_buckets=64)
    for second in range(1, 1_001):
        now = T0 + second * 1_000
        watermark.observe([TrackingSample(f"m{second}", now - 500, now - 1_000)], now)
        # Nothing is committed: B stays at the first message (published T0 + 0.5 s, event time T0).
        assert watermark.current(now) == min(now - BAND, T0)
        assert watermark.bucket_count <= 64
    assert watermark.bucket_count > 32


def test_emulator_probe_tracks_pending_and_early_commits() -> None:
    probe = EmulatorBacklogProbe()
    assert probe.oldest_unacked_ms(T0) is None
    probe.tracked([TrackingSample("a", T0 + 1, 0), TrackingSample("b", T0 + 2, 0)], T0 + 10)
    assert probe.oldest_unacked_ms(T0) == T0 + 1
    probe.committed([("a", T0 + 1), ("c", T0 + 3)])  # c committed before the tracking subscription showed it
    assert probe.oldest_unacked_ms(T0) == T0 + 2
    probe.tracked([TrackingSample("c", T0 + 3, 0)], T0 + 20)
    assert probe.oldest_unacked_ms(T0) == T0 + 2
    probe.committed([("b", T0 + 2), ("b", T0 + 2)])  # a redelivered message reported twice
    assert probe.oldest_unacked_ms(T0) is None
    assert probe.pending_count == 0
    # The second report waits as an early commit (it also absorbs a redelivery on the tracking subscription)...
    probe.tracked([TrackingSample("b", T0 + 2, 0)], T0 + 30)
    assert probe.oldest_unacked_ms(T0) is None
    assert probe.to_state()["early"] == []
    probe.committed([("b", T0 + 2)])
    assert probe.to_state()["early"] == [["b", T0 + 2]]
    # ...until the tracking subscription is `expire_after_ms` past it.
    probe.tracked([], T0 + 2 + 600_000)
    assert probe.to_state()["early"] == [["b", T0 + 2]]
    probe.tracked([], T0 + 2 + 600_001)
    assert probe.to_state()["early"] == []


def test_emulator_probe_recognises_a_killed_drains_redelivery_after_the_commit() -> None:
    """A run persisted its drain, then was killed before acking it; the next run committed those messages from
    the base subscription; once their lease runs out, after publishing stopped, the tracking subscription shows
    them again. Pending again, they would hold the watermark for ever."""

    def reloaded(probe: EmulatorBacklogProbe) -> EmulatorBacklogProbe:
        return EmulatorBacklogProbe(redelivery_ms=120_000).from_state(json.loads(json.dumps(probe.to_state())))

    probe = EmulatorBacklogProbe(redelivery_ms=120_000)
    drained = [TrackingSample("1", T0 + 1, 0), TrackingSample("2", T0 + 2, 0)]
    probe.tracked(drained, T0 + 10)
    probe = reloaded(probe)  # killed here: never acked
    probe.tracked([], T0 + 5_000)  # the next run; the killed drain's messages are still leased
    probe.acked(T0 + 5_000)
    probe.committed([("1", T0 + 1), ("2", T0 + 2)])
    assert probe.oldest_unacked_ms(T0) is None
    probe = reloaded(probe)
    probe.tracked(drained, T0 + 70_000)  # the lease ran out: both come back
    assert probe.oldest_unacked_ms(T0) is None and probe.pending_count == 0
    # This drain may be killed unacked too: then they come back once more, and are still recognised...
    probe = reloaded(probe)
    probe.tracked(drained, T0 + 70_000 + 120_000)
    assert probe.oldest_unacked_ms(T0) is None
    # ...and once a drain is acked, its messages are forgotten: the state keeps only unacknowledged drains.
    probe.acked(T0 + 70_000 + 120_000)
    assert probe.to_state()["leased"] == []


def test_emulator_probe_forgets_leases_a_window_after_their_drain() -> None:
    probe = EmulatorBacklogProbe(redelivery_ms=120_000)
    probe.tracked([TrackingSample("1", T0 + 1, 0)], T0 + 10)  # never acked
    probe.committed([("1", T0 + 1)])
    probe.tracked([], T0 + 10 + 120_000)
    assert probe.to_state()["leased"] == [["1", T0 + 1, T0 + 10]]
    probe.tracked([], T0 + 10 + 120_001)
    assert probe.to_state()["leased"] == []
    # Past the window, a redelivery is pending again: held until `expire_after_ms` of newer commits.
    probe.tracked([TrackingSample("1", T0 + 1, 0)], T0 + 200_000)
    assert probe.oldest_unacked_ms(T0) == T0 + 1


def test_a_drain_killed_before_saving_holds_the_watermark_until_its_leases_run_out() -> None:
    """A run began a drain (saved first), pulled messages under lease and was killed before saving them. A drain
    within the ack deadline finds the tracking subscription empty; it must not take that as "nothing waiting"."""

    def reloaded(watermark: PubSubWatermark) -> PubSubWatermark:
        state = json.loads(json.dumps(watermark.to_state()))
        return PubSubWatermark(EmulatorBacklogProbe(redelivery_ms=120_000), band_ms=BAND).from_state(state)

    watermark = PubSubWatermark(EmulatorBacklogProbe(redelivery_ms=120_000), band_ms=BAND)
    watermark.drain_begun(T0)
    watermark.observe([Msg("0", T0 - 1, T0 - 1).sample()], T0)
    watermark.committed([("0", T0 - 1)])
    assert watermark.current(T0) == T0 - BAND
    lost = Msg("1", T0 + 1_000, T0 - 5_000)  # within the band of its publish time: never late
    watermark.drain_begun(T0 + 2_000)
    watermark = reloaded(watermark)  # killed holding `lost` leased
    watermark.drain_begun(T0 + 30_000)
    watermark.observe([], T0 + 30_000)  # empty: `lost` is leased to the dead drain
    with pytest.raises(BacklogUnknown, match=f"begun at {T0 + 2_000}"):
        watermark.probe.oldest_unacked_ms(T0 + 30_000)
    assert watermark.current(T0 + 30_000) == T0 - BAND  # it would be T0 + 20_000, past `lost`
    watermark = reloaded(watermark)
    watermark.drain_begun(T0 + 2_000 + 120_001)  # the lease has run out: this drain gets `lost`
    watermark.observe([lost.sample()], T0 + 2_000 + 120_001)
    assert watermark.current(T0 + 122_001) == lost.event_ms
    watermark.committed([lost.key])
    assert watermark.current(T0 + 122_001) == T0 + 112_001
    assert watermark.to_state()["probe"]["open_drains"] == []


def test_a_drain_still_running_in_another_run_holds_the_watermark_until_it_saves() -> None:
    probe = EmulatorBacklogProbe(redelivery_ms=120_000)
    probe.drain_begun(T0)  # run A
    probe.drain_begun(T0 + 500)  # run B, while A is still pulling
    probe.tracked([], T0 + 500)  # B finds nothing: A holds what was there
    with pytest.raises(BacklogUnknown):
        probe.oldest_unacked_ms(T0 + 600)
    probe.tracked([TrackingSample("1", T0 - 100, T0 - 100)], T0)  # A saves
    assert probe.oldest_unacked_ms(T0 + 700) == T0 - 100


def test_emulator_probe_keeps_at_most_max_pending_leases() -> None:
    probe = EmulatorBacklogProbe(max_pending=3)
    probe.tracked([TrackingSample(str(i), T0 + i, 0) for i in range(5)], T0 + 1_000)
    probe.tracked([TrackingSample("9", T0 + 9, 0)], T0 + 2_000)
    assert [key[:2] for key in probe.to_state()["leased"]][-1] == ["9", T0 + 9]
    assert len(probe.to_state()["leased"]) == 3


def test_emulator_probe_keeps_restarted_message_ids_apart_and_expires_lost_ones() -> None:
    probe = EmulatorBacklogProbe(expire_after_ms=60_000)
    probe.tracked([TrackingSample("1", T0, 0)], T0 + 1)  # then the emulator restarts: this one is lost
    probe.tracked([TrackingSample("1", T0 + 5_000, 0), TrackingSample("2", T0 + 59_999, 0)], T0 + 60_000)
    probe.committed([("1", T0 + 5_000)])
    assert probe.oldest_unacked_ms(T0) == T0
    probe.committed([("2", T0 + 59_999)])
    assert probe.oldest_unacked_ms(T0) == T0
    probe.tracked([TrackingSample("3", T0 + 60_000, 0)], T0 + 61_000)
    probe.committed([("3", T0 + 60_000)])
    assert probe.oldest_unacked_ms(T0) is None


def test_emulator_probe_state_is_bounded_and_round_trips() -> None:
    probe = EmulatorBacklogProbe(max_pending=3)
    samples = [TrackingSample(str(i), T0 + 1_000 * i, 0) for i in range(6)]
    probe.tracked(samples, T0 + 10_000)
    assert probe.pending_count == 6
    state = json.loads(json.dumps(probe.to_state()))
    assert len(state["pending"]) == 3 and sum(n for _, n in state["overflow"]) == 3
    restored = EmulatorBacklogProbe(max_pending=3).from_state(state)
    assert restored.oldest_unacked_ms(T0) == T0
    restored.committed([("0", T0), ("1", T0 + 1_000), ("2", T0 + 2_000), ("3", T0 + 3_000)])
    assert restored.oldest_unacked_ms(T0) == T0 + 4_000
    restored.committed([("4", T0 + 4_000), ("5", T0 + 5_000)])
    assert restored.oldest_unacked_ms(T0) is None
    early = EmulatorBacklogProbe(max_pending=4)
    early.committed([(f"e{i}", T0 + i) for i in range(10)])
    assert early.to_state()["early"] == [[f"e{i}", T0 + i] for i in range(6, 10)]
    early.tracked([], T0 + 700_000)  # the tracking subscription is far past them now
    assert early.to_state()["early"] == []


def test_cloud_monitoring_probe_reads_the_newest_sample() -> None:
    def point(at_s: int, age_s: int) -> SimpleNamespace:
        end = datetime.fromtimestamp(at_s, UTC)
        return SimpleNamespace(
            interval=SimpleNamespace(end_time=end), value=SimpleNamespace(int64_value=age_s)
        )

    class Client:
        def __init__(self) -> None:
            self.requests: list[dict[str, Any]] = []
            self.answer: list[SimpleNamespace] = []

        def list_time_series(self, request: dict[str, Any]) -> list[SimpleNamespace]:
            self.requests.append(request)
            return self.answer

    client = Client()
    probe = CloudMonitoringBacklogProbe("proj", "onceflow-events-sub", client=client)
    client.answer = [SimpleNamespace(points=[point(T0 // 1000 - 60, 5), point(T0 // 1000, 42)])]
    assert probe.oldest_unacked_ms(T0 + 30_500) == T0 - 42_000
    assert client.requests[0] == {
        "name": "projects/proj",
        "filter": 'metric.type = "pubsub.googleapis.com/subscription/oldest_unacked_message_age" '
        'AND resource.type = "pubsub_subscription" AND resource.labels.subscription_id = "onceflow-events-sub"',
        "interval": {
            "start_time": {"seconds": (T0 + 30_500 - 600_000) // 1000, "nanos": 500_000_000},
            "end_time": {"seconds": (T0 + 30_500) // 1000, "nanos": 500_000_000},
        },
    }
    client.answer = []
    with pytest.raises(BacklogUnknown):  # no sample: unknown, not "no backlog"
        probe.oldest_unacked_ms(T0 + 90_000)
    client.answer = [SimpleNamespace(points=[point(T0 // 1000 + 60, 0)])]
    assert probe.oldest_unacked_ms(T0 + 90_000) is None


def test_kafka_watermark_is_the_minimum_over_partitions_not_idle() -> None:
    watermark = KafkaWatermark(1_000, idle_timeout_ms=10_000)
    watermark.observe({0: 50_000, 1: 20_000}, now_ms=100_000)
    assert watermark.current(100_000) == 19_000  # the partition behind in event time holds the others
    watermark.observe({0: 60_000}, now_ms=105_000)
    assert watermark.current(105_000) == 19_000
    assert watermark.current(111_000) == 59_000  # partition 1 idle for the timeout: it holds no more
    watermark.observe({}, now_ms=112_000, waiting=[2])  # records waiting in a partition never read yet
    assert watermark.current(112_000) == 59_000
    assert watermark.current(200_000) == 199_000  # every partition idle: near real time
    restored = KafkaWatermark(1_000, idle_timeout_ms=10_000).from_state(watermark.to_state())
    assert restored.current(150_000) == 199_000  # never goes back


def test_a_kafka_transaction_held_open_holds_the_watermark_however_long() -> None:
    watermark = KafkaWatermark(1_000, idle_timeout_ms=10_000)
    watermark.observe({0: 50_000, 1: 50_000}, now_ms=100_000)
    for now in range(105_000, 200_000, 5_000):  # partition 1 brings nothing but keeps a transaction open
        watermark.observe({0: now - 50_000}, now_ms=now, open_=[1])
        assert watermark.current(now) == 49_000
    watermark.observe({0: 150_000}, now_ms=200_000)  # committed: no transaction open there any more
    assert watermark.current(206_000) == 149_000


def test_a_kafka_partition_of_only_invalid_records_stops_holding_after_the_idle_time() -> None:
    watermark = KafkaWatermark(1_000, idle_timeout_ms=10_000)
    watermark.observe({0: 50_000}, now_ms=100_000)
    assert watermark.current(100_000) == 49_000
    for now in range(102_000, 130_000, 2_000):  # partition 2: malformed lines only, always more waiting
        watermark.observe({0: now - 50_000, 2: None}, now_ms=now, waiting=[2])
        assert watermark.current(now) == (49_000 if now < 112_000 else now - 51_000)
    # A valid record from it makes it hold again; a state saved and restored keeps what it knew.
    watermark.observe({2: 60_000}, now_ms=130_000, waiting=[2])
    restored = KafkaWatermark(1_000, idle_timeout_ms=10_000).from_state(watermark.to_state())
    assert restored.current(131_000) == 77_000  # it holds again, never below what the watermark said


def test_a_kafka_watermark_state_from_before_validity_was_told_apart_reads_as_active() -> None:
    state = {"kind": "kafka", "watermark_ms": 40_000, "max_event_time_ms": {"0": 50_000, "1": 45_000},
             "active_ms": {"0": 100_000, "1": 100_000}}
    watermark = KafkaWatermark(1_000, idle_timeout_ms=10_000).from_state(state)
    assert watermark.current(105_000) == 44_000 and watermark.current(111_000) == 110_000
