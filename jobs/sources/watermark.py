"""Event-time watermarks of onceflow's sources: heuristic, monotonic, persisted with the source checkpoint.

A watermark `W` (epoch milliseconds) is the platform's claim that every record still to come has an event time at
or after `W`; a window `[start, end)` closes when `W` passes `end + allowed_lateness`, and a record that arrives
after that is late (kept in the raw table, counted, never lost). Every estimator here is

- monotonic: `current` never returns less than it returned before, also across `to_state` / `from_state`;
- clock-free: every method that needs the time takes `now_ms`, so tests drive it with exact values;
- persistent: `to_state()` is a JSON-serialisable dict for `SourceCheckpoint.watermark`; its key `watermark_ms`
  is the last watermark returned (None before any data), readable without the estimator.

`PubSubWatermark` is Dataflow's heuristic for Pub/Sub; `FileWatermark` is the bounded-out-of-orderness rule for
file sources. The Pub/Sub estimator needs the base subscription's oldest unacknowledged publish time from a
`onceflow.jobs.sources.backlog.BacklogProbe`.

Wiring, once per micro-batch of a Pub/Sub source (`onceflow.jobs.sources.tracking` drains the tracking subscription):

    watermark = PubSubWatermark(EmulatorBacklogProbe(), band_ms=10_000).from_state(checkpoint.watermark)
    watermark.drain_begun(now_ms)                                      # saved first if probe.sees_drains
    drain = TrackingDrainer(client, spec.tracking, spec.timestamp_attribute).drain(now_ms)  # beside the base pull
    watermark.observe(drain.samples, drain.tracked_through_ms)
    checkpoint.watermark = watermark.to_state()                        # persisted, then the drain is acked
    TrackingDrainer(...).ack(drain)
    watermark.acked(drain.started_ms)                                  # saved with the next state
    ...land and ingest the batch...
    watermark.committed(zip(message_ids, publish_times_ms))            # the batch just committed
    watermark.current(now_ms)
    checkpoint.watermark = watermark.to_state()                        # saved with the checkpoint
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, Self, runtime_checkable

from onceflow.jobs.sources.backlog import (
    DEFAULT_BUCKET_MS,
    BacklogProbe,
    BacklogUnknown,
    MessageKey,
    check_state_kind,
    floor_to,
)
from onceflow.jobs.sources.tracking import TrackingSample

DEFAULT_BAND_MS = 10_000
DEFAULT_IDLE_TIMEOUT_MS = 120_000


@runtime_checkable
class WatermarkEstimator(Protocol):
    """What every source's watermark offers the platform."""

    def current(self, now_ms: int) -> int | None:
        """The event-time watermark at `now_ms` in epoch ms, None before any data; never less than before."""
        ...

    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable state for `SourceCheckpoint.watermark`; `state["watermark_ms"]` is the watermark."""
        ...

    def from_state(self, state: Mapping[str, Any]) -> Self:
        """Restore a state written by `to_state` (an empty mapping changes nothing) and return this estimator."""
        ...

class PubSubWatermark:
    """Dataflow's watermark heuristic for a Pub/Sub source, fed by a metadata-only tracking subscription.

    The tracking subscription is drained continuously and acked at once; each message becomes a `TrackingSample`
    in a sparse histogram: per `bucket_ms` of publish time, the minimum event time. Let

    - `T` = the tracking subscription's oldest unacked publish time: after a drain that emptied it, the time the
      drain started (`observe(..., tracked_through_ms)`), since everything published before it has been seen;
    - `B` = the base subscription's oldest unacked publish time, from the `BacklogProbe`; `B = T` without backlog;
    - `low = min(B, T - band_ms)`.

    Then `current(now_ms)` is the minimum of `low` and the event times of all samples whose publish time lies in
    `[low, T]` (a bucket counts when it overlaps that range); with no such sample it is `low` itself. Including
    `low` in the minimum goes one step beyond Dataflow's formula and makes the guarantee exact, given a drain
    before each `current` and a probe that is up to date: a message whose event time is at most `band_ms` before
    its publish time is never late, whether it is still waiting in the base
    subscription (then `B` and its sample hold the watermark below it), or not yet seen by the tracking
    subscription (then it was published after `T`, so its event time is past `T - band_ms`). A message delayed
    more than `band_ms` may be late, unless the base subscription's backlog still holds it.

    Idle rule: when the base subscription has no backlog now, no sample was published during the last
    `idle_timeout_ms` and no backlog was seen during it either (the probe is consulted at each `current`), the
    watermark advances to `now_ms - idle_allowance_ms` (default: the band). Drain the tracking subscription
    before asking for the watermark; the idle rule cannot see messages the drain has not pulled yet.

    When the probe cannot tell the backlog (`BacklogUnknown`), the watermark stays where it is: an unknown
    backlog may hold anything.

    The result never goes back: a smaller value (a backlog that reappears older, say) leaves the watermark where
    it is. Buckets entirely before `low` are pruned after each `current`; if more than `max_buckets` remain (a
    long backlog), neighbouring buckets are merged, which only makes the watermark more cautious. The state is
    therefore at most `max_buckets` buckets plus the probe's.
    """

    def __init__(
        self,
        probe: BacklogProbe,
        *,
        band_ms: int = DEFAULT_BAND_MS,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        idle_allowance_ms: int | None = None,
        bucket_ms: int = DEFAULT_BUCKET_MS,
        max_buckets: int = 3_600,
    ) -> None:
        if band_ms < 0 or idle_timeout_ms <= 0 or bucket_ms < 1 or max_buckets < 2:
            raise ValueError(
                "band_ms >= 0, idle_timeout_ms > 0, bucket_ms >= 1 and max_buckets >= 2 are required"
            )
        self.probe = probe
        self.band_ms = band_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.idle_allowance_ms = band_ms if idle_allowance_ms is None else idle_allowance_ms
        self.bucket_ms = bucket_ms
        self.max_buckets = max_buckets
        # Sorted, disjoint [start, end, min event time] publish-time buckets.
        self._buckets: list[list[int]] = []
        self._tracked_through_ms: int | None = None
        self._last_data_ms: int | None = None
        self._backlog_seen_ms: int | None = None
        self._watermark_ms: int | None = None

    @property
    def bucket_count(self) -> int:
        """How many histogram buckets the state holds."""
        return len(self._buckets)

    def observe(self, samples: Sequence[TrackingSample], tracked_through_ms: int | None) -> None:
        """Record a drain of the tracking subscription and pass it on to the probe.

        `tracked_through_ms`: every message published before it has now been seen (the drain's start time when the
        drain emptied the subscription), or None when the drain stopped early and nothing new is known.
        """
        by_bucket: dict[int, int] = {}
        for sample in samples:
            bucket = floor_to(sample.publish_time_ms, self.bucket_ms)
            by_bucket[bucket] = min(by_bucket.get(bucket, sample.event_time_ms), sample.event_time_ms)
            if self._last_data_ms is None or sample.publish_time_ms > self._last_data_ms:
                self._last_data_ms = sample.publish_time_ms
        for bucket, event_ms in by_bucket.items():
            self._add(bucket, event_ms)
        if tracked_through_ms is not None and (
            self._tracked_through_ms is None or tracked_through_ms > self._tracked_through_ms
        ):
            self._tracked_through_ms = tracked_through_ms
        self._coarsen()
        self.probe.tracked(samples, tracked_through_ms)

    def drain_begun(self, started_ms: int) -> None:
        """Report a tracking drain starting at `started_ms`, before it pulls (passed on to the probe)."""
        self.probe.drain_begun(started_ms)

    def acked(self, drain_started_ms: int) -> None:
        """Report the tracking drain that began at `drain_started_ms` acknowledged (passed on to the probe)."""
        self.probe.acked(drain_started_ms)

    def committed(self, messages: Iterable[MessageKey]) -> None:
        """Report base-subscription messages `(message_id, publish_time_ms)` committed to the raw table.

        They are data published at those times, too: a state that lost its samples (a checkpoint restored from an
        older copy, realigned with the lake's commits) still knows that data came, so the watermark resumes.
        Only the idle rule reads this, and a later time only delays it."""
        messages = list(messages)
        self.probe.committed(messages)
        self._last_data_ms = _max_opt(self._last_data_ms, max((t for _, t in messages), default=None))

    def current(self, now_ms: int) -> int | None:
        """Compute the watermark at `now_ms` (see the class), record it and return it; None before any data."""
        through = self._tracked_through_ms
        if through is None or self._last_data_ms is None:
            return self._watermark_ms
        try:
            backlog = self.probe.oldest_unacked_ms(now_ms)
        except BacklogUnknown:
            # Without the base subscription's backlog nothing bounds the watermark from below: it stays put.
            return self._watermark_ms
        if backlog is not None and (self._backlog_seen_ms is None or now_ms > self._backlog_seen_ms):
            self._backlog_seen_ms = now_ms
        low = min(through if backlog is None else backlog, through - self.band_ms)
        value = low
        first = bisect.bisect_right(self._buckets, low, key=lambda b: b[1])
        for start, _, event_ms in self._buckets[first:]:
            if start > through:
                break
            value = min(value, event_ms)
        # A backlog seen now restarts the idle timeout, so the idle rule never fires while there is one.
        quiet_since = _max_opt(self._last_data_ms, self._backlog_seen_ms)
        assert quiet_since is not None
        if now_ms - quiet_since >= self.idle_timeout_ms:
            value = max(value, now_ms - self.idle_allowance_ms)
        if self._watermark_ms is None or value > self._watermark_ms:
            self._watermark_ms = value
        del self._buckets[:first]
        return self._watermark_ms

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": "pubsub",
            "watermark_ms": self._watermark_ms,
            "tracked_through_ms": self._tracked_through_ms,
            "last_data_ms": self._last_data_ms,
            "backlog_seen_ms": self._backlog_seen_ms,
            "buckets": [list(b) for b in self._buckets],
            "probe": self.probe.to_state(),
        }

    def from_state(self, state: Mapping[str, Any]) -> Self:
        """Restore a persisted state (configuration stays this instance's); an empty mapping changes nothing.

        The watermark and `T` become the larger of this instance's and the state's, so restoring never moves
        either backward.
        """
        if not state:
            return self
        check_state_kind(state, "pubsub")
        self._watermark_ms = _max_opt(self._watermark_ms, _opt_int(state.get("watermark_ms")))
        self._tracked_through_ms = _max_opt(
            self._tracked_through_ms, _opt_int(state.get("tracked_through_ms"))
        )
        self._last_data_ms = _max_opt(self._last_data_ms, _opt_int(state.get("last_data_ms")))
        self._backlog_seen_ms = _max_opt(self._backlog_seen_ms, _opt_int(state.get("backlog_seen_ms")))
        self._buckets = sorted([int(s), int(e), int(m)] for s, e, m in state.get("buckets", ()))
        self.probe.from_state(state.get("probe") or {})
        return self

    def _add(self, bucket: int, event_ms: int) -> None:
        i = bisect.bisect_right(self._buckets, bucket, key=lambda b: b[0]) - 1
        if i >= 0 and bucket < self._buckets[i][1]:
            self._buckets[i][2] = min(self._buckets[i][2], event_ms)
        else:
            self._buckets.insert(i + 1, [bucket, bucket + self.bucket_ms, event_ms])

    def _coarsen(self) -> None:
        while len(self._buckets) > self.max_buckets:
            pairs = zip(self._buckets[::2], self._buckets[1::2], strict=False)
            merged = [[a[0], b[1], min(a[2], b[2])] for a, b in pairs]
            if len(self._buckets) % 2:
                merged.append(self._buckets[-1])
            self._buckets = merged

class BoundedOutOfOrderness:
    """What the bounded-out-of-orderness estimators (files, Kafka) are given: the bound, and after how long without
    data (`idle_timeout_ms`) the watermark goes to `now_ms - idle_allowance_ms` (default: the bound)."""

    def __init__(
        self, out_of_orderness_ms: int, *, idle_timeout_ms: int | None = None, idle_allowance_ms: int | None = None
    ) -> None:
        idle_timeout_ms = DEFAULT_IDLE_TIMEOUT_MS if idle_timeout_ms is None else idle_timeout_ms
        if out_of_orderness_ms < 0 or idle_timeout_ms <= 0:
            raise ValueError("out_of_orderness_ms >= 0 and idle_timeout_ms > 0 are required")
        self.out_of_orderness_ms = out_of_orderness_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.idle_allowance_ms = out_of_orderness_ms if idle_allowance_ms is None else idle_allowance_ms
        self._watermark_ms: int | None = None


class FileWatermark(BoundedOutOfOrderness):
    """The watermark of a file source: the maximum event time seen minus a declared out-of-orderness bound.

    `observe` is told about every committed batch of new files (and, with `None`, about new files that are known
    to be waiting): a record more than `out_of_orderness_ms` older than the newest record seen before it may be
    late; one within the bound never is. Idle rule: when no new files were observed during the last
    `idle_timeout_ms`, the watermark advances to `now_ms - idle_allowance_ms` (default: the out-of-orderness
    bound, the same allowance a new file's records get). None before any record; never goes back.
    """

    def __init__(self, out_of_orderness_ms: int, **idle: int | None) -> None:
        super().__init__(out_of_orderness_ms, **idle)
        self._max_event_ms: int | None = None
        self._last_files_ms: int | None = None

    def observe(self, max_event_time_ms: int | None, now_ms: int) -> None:
        """New files at `now_ms` whose newest record has `max_event_time_ms` (None: no valid record, or waiting)."""
        if max_event_time_ms is not None:
            self._max_event_ms = _max_opt(self._max_event_ms, max_event_time_ms)
        self._last_files_ms = _max_opt(self._last_files_ms, now_ms)

    def current(self, now_ms: int) -> int | None:
        """Compute the watermark at `now_ms` (see the class), record it and return it; None before any record."""
        if self._max_event_ms is None:
            return self._watermark_ms
        value = self._max_event_ms - self.out_of_orderness_ms
        if self._last_files_ms is not None and now_ms - self._last_files_ms >= self.idle_timeout_ms:
            value = max(value, now_ms - self.idle_allowance_ms)
        self._watermark_ms = _max_opt(self._watermark_ms, value)
        return self._watermark_ms

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": "files",
            "watermark_ms": self._watermark_ms,
            "max_event_time_ms": self._max_event_ms,
            "last_files_ms": self._last_files_ms,
        }

    def from_state(self, state: Mapping[str, Any]) -> Self:
        """Restore a persisted state, never moving the watermark backward; an empty mapping changes nothing."""
        if not state:
            return self
        check_state_kind(state, "files")
        self._watermark_ms = _max_opt(self._watermark_ms, _opt_int(state.get("watermark_ms")))
        self._max_event_ms = _max_opt(self._max_event_ms, _opt_int(state.get("max_event_time_ms")))
        self._last_files_ms = _max_opt(self._last_files_ms, _opt_int(state.get("last_files_ms")))
        return self


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _max_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
