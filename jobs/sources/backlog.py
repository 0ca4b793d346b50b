"""The base subscription's backlog for the Pub/Sub watermark: its oldest unacknowledged publish time.

`PubSubWatermark` needs to know how old the oldest message still waiting in the base subscription is. On GCP that
is Cloud Monitoring's `oldest_unacked_message_age` (`cloud_backlog.CloudMonitoringBacklogProbe`); the emulator has no metrics,
so there `EmulatorBacklogProbe` keeps the backlog from what onceflow itself saw on the tracking subscription and
committed from the base subscription.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, Self, runtime_checkable

from onceflow.jobs.sources.tracking import TrackingSample

DEFAULT_BUCKET_MS = 1_000

MessageKey = tuple[str, int]
"""A Pub/Sub message as both subscriptions of a topic see it: `(message_id, publish_time_ms)`."""


class BacklogUnknown(Exception):
    """The probe cannot tell the base subscription's backlog now; the message says why."""


@runtime_checkable
class BacklogProbe(Protocol):
    """Where the base (main) subscription's oldest unacknowledged publish time comes from.

    `PubSubWatermark` forwards what it learns to its probe: every drain begun (`drain_begun`), every tracked sample
    (`tracked`), every acknowledged drain (`acked`) and every message the pipeline committed (`committed`); a probe
    that reads the backlog from elsewhere ignores them.
    """

    @property
    def sees_drains(self) -> bool:
        """Whether the backlog comes from the drains themselves: then a drain's start must be saved before it."""
        ...

    def oldest_unacked_ms(self, now_ms: int) -> int | None:
        """The oldest publish time still waiting in the base subscription, None when it has no backlog; raises
        `BacklogUnknown` when it cannot tell."""
        ...

    def drain_begun(self, started_ms: int) -> None:
        """A tracking drain starts at `started_ms` (saved before it pulls anything)."""
        ...

    def tracked(self, samples: Sequence[TrackingSample], tracked_through_ms: int | None) -> None:
        """Messages just seen on the tracking subscription, which has seen all published before `tracked_through_ms`."""
        ...

    def acked(self, drain_started_ms: int) -> None:
        """The tracking drain that began at `drain_started_ms` is acknowledged."""
        ...

    def committed(self, messages: Iterable[MessageKey]) -> None:
        """Messages of the base subscription that are now committed to the raw table."""
        ...

    def to_state(self) -> dict[str, Any]: ...

    def from_state(self, state: Mapping[str, Any]) -> Self: ...

class ReadsBacklogElsewhere:
    """For a probe that reads the backlog from elsewhere: what the pipeline saw and committed changes nothing."""

    sees_drains = False

    def drain_begun(self, started_ms: int) -> None:
        return None

    def tracked(self, samples: Sequence[TrackingSample], tracked_through_ms: int | None) -> None:
        return None

    def acked(self, drain_started_ms: int) -> None:
        return None

    def committed(self, messages: Iterable[MessageKey]) -> None:
        return None


class EmulatorBacklogProbe:
    """The base subscription's backlog as onceflow itself saw it, for the Pub/Sub emulator (which has no metrics).

    A message is pending from the moment the tracking subscription shows it until the pipeline reports it
    committed; the oldest unacked publish time is the oldest pending publish time. Messages are keyed by
    `(message_id, publish_time_ms)`, which both subscriptions share: the emulator restarts message ids at 1 when it
    restarts, and the publish time keeps a new message "1" apart from an old one. A message the pipeline commits
    before the tracking subscription shows it is remembered until it does, or until the tracking subscription has
    moved `expire_after_ms` past its publish time (it will not show up any more).

    State stays bounded:

    - at most `max_pending` messages are kept by key; beyond that, newer pending messages are only counted per
      publish-time bucket (`bucket_ms`), and a commit that matches no key decrements its bucket. In that mode a
      message delivered twice to the base subscription can be counted off twice, so the backlog may look younger
      than it is until the pile shrinks under `max_pending`;
    - a pending message expires once the pipeline has committed messages published `expire_after_ms` after it.
      This drops messages that will never be committed: those lost when the emulator restarted. An expired
      message that does arrive later is still ingested but may be late. Until the pipeline commits newer messages
      (for instance right after an emulator restart, with nothing published since), such an entry holds the
      watermark back;
    - a drain's messages are kept as *leased* until the caller reports the drain acknowledged (`acked`), or
      until a drain starts `redelivery_ms` after it. A run killed after persisting a drain but before acking it
      leaves those messages leased by the emulator, which shows them again once the ack deadline runs out,
      usually after the base subscription committed them. Leased, such a redelivery is recognised; pending
      again, it would hold the watermark until `expire_after_ms` of newer commits, for ever once publishing
      stops. So `redelivery_ms` must exceed the tracking subscription's ack deadline. With every drain acked,
      only the latest drain's messages are kept, at most `max_pending` of them;
    - a drain's start is saved before it pulls (`drain_begun`) and stays *open* until its samples are saved
      (`tracked`). A drain still open may hold leases on messages this probe has never seen (its run still
      draining, or killed before saving): the emulator shows them to no other drain until their ack deadline runs
      out, so an empty drain proves nothing about them. While a drain is open the backlog is unknown
      (`BacklogUnknown`) and the watermark stays where it is, until that drain saves or one starts `redelivery_ms`
      after it (it pulls what the open drain leased). Only drains begun within `redelivery_ms` stay open.
    """

    sees_drains = True

    def __init__(
        self,
        *,
        max_pending: int = 20_000,
        expire_after_ms: int = 600_000,
        redelivery_ms: int = 120_000,
        bucket_ms: int = DEFAULT_BUCKET_MS,
    ) -> None:
        if max_pending < 1 or expire_after_ms < 0 or redelivery_ms < 0 or bucket_ms < 1:
            raise ValueError(
                "max_pending and bucket_ms must be positive, expire_after_ms and redelivery_ms not negative"
            )
        self.max_pending = max_pending
        self.expire_after_ms = expire_after_ms
        self.redelivery_ms = redelivery_ms
        self.bucket_ms = bucket_ms
        self._pending: set[MessageKey] = set()
        self._overflow: dict[int, int] = {}
        self._early: set[MessageKey] = set()
        # A message shown by a drain not known to be acknowledged -> that drain's start.
        self._leased: dict[MessageKey, int] = {}
        self._committed_through_ms: int | None = None
        self._open_drains: set[int] = set()  # drains begun and not yet saved, by start time

    @property
    def pending_count(self) -> int:
        """How many tracked messages are still waiting to be committed (kept by key or only counted)."""
        return len(self._pending) + sum(self._overflow.values())

    def oldest_unacked_ms(self, now_ms: int) -> int | None:
        """The oldest publish time among pending messages, None when there are none (`now_ms` is not needed);
        `BacklogUnknown` while a drain is open."""
        if self._open_drains:
            raise BacklogUnknown(
                f"the tracking drain begun at {min(self._open_drains)} ms has not saved what it leased"
            )
        oldest = min((publish for _, publish in self._pending), default=None)
        if self._overflow:
            bucket = min(self._overflow)
            oldest = bucket if oldest is None else min(oldest, bucket)
        return oldest

    def drain_begun(self, started_ms: int) -> None:
        """Open the drain that starts at `started_ms`, until `tracked` saves it."""
        self._open_drains.add(started_ms)

    def tracked(self, samples: Sequence[TrackingSample], tracked_through_ms: int | None) -> None:
        """Make every sample pending unless the pipeline already committed it or it is a leased one shown again;
        close the drain that began at `tracked_through_ms` and those whose leases have run out before it."""
        drain_ms = tracked_through_ms if tracked_through_ms is not None else max(self._leased.values(), default=0)
        for sample in samples:
            key = (sample.message_id, sample.publish_time_ms)
            if key in self._early:
                self._early.discard(key)
            elif key not in self._pending and key not in self._leased:
                if len(self._pending) < self.max_pending:
                    self._pending.add(key)
                else:
                    bucket = floor_to(sample.publish_time_ms, self.bucket_ms)
                    self._overflow[bucket] = self._overflow.get(bucket, 0) + 1
            self._leased[key] = drain_ms
        if tracked_through_ms is not None:
            # The tracking subscription has shown everything published before `tracked_through_ms`: an early
            # commit it has not matched well after that was never on it (the margin covers a message whose
            # publish call was still completing when the drain began).
            cutoff = tracked_through_ms - self.expire_after_ms
            self._early = {key for key in self._early if key[1] >= cutoff}
            # Leases older than `redelivery_ms` ran out before this drain began: it pulled what they gave back.
            lease_cutoff = tracked_through_ms - self.redelivery_ms
            self._leased = {key: at for key, at in self._leased.items() if at >= lease_cutoff}
            self._open_drains = {at for at in self._open_drains if at >= lease_cutoff and at != tracked_through_ms}
        if len(self._leased) > self.max_pending:
            # Forgetting a lease only risks holding the watermark back (until expiry), never pushing it too far.
            self._leased = dict(sorted(self._leased.items(), key=lambda item: item[1])[-self.max_pending :])

    def acked(self, drain_started_ms: int) -> None:
        """The drain that began at `drain_started_ms` is acknowledged: its messages will not be shown again."""
        self._leased = {key: at for key, at in self._leased.items() if at != drain_started_ms}

    def committed(self, messages: Iterable[MessageKey]) -> None:
        """Take committed messages out of the backlog; unknown ones wait for the tracking subscription."""
        for message_id, publish_time_ms in messages:
            key = (message_id, publish_time_ms)
            if self._committed_through_ms is None or publish_time_ms > self._committed_through_ms:
                self._committed_through_ms = publish_time_ms
            if key in self._pending:
                self._pending.discard(key)
                continue
            bucket = floor_to(publish_time_ms, self.bucket_ms)
            if self._overflow.get(bucket, 0) > 0:
                self._overflow[bucket] -= 1
                if not self._overflow[bucket]:
                    del self._overflow[bucket]
            else:
                self._early.add(key)
        if len(self._early) > self.max_pending:
            # Forgetting an early commit only holds the watermark back (until expiry), never pushes it too far.
            self._early = set(sorted(self._early, key=lambda k: k[1])[-self.max_pending :])
        self._expire()

    def _expire(self) -> None:
        if self._committed_through_ms is None:
            return
        cutoff = self._committed_through_ms - self.expire_after_ms
        self._pending = {key for key in self._pending if key[1] > cutoff}
        self._overflow = {b: n for b, n in self._overflow.items() if b + self.bucket_ms - 1 > cutoff}

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": "emulator_backlog",
            "pending": sorted([list(key) for key in self._pending], key=lambda k: (k[1], k[0])),
            "overflow": sorted([b, n] for b, n in self._overflow.items()),
            "early": sorted([list(key) for key in self._early], key=lambda k: (k[1], k[0])),
            "leased": sorted([[i, p, at] for (i, p), at in self._leased.items()], key=lambda k: (k[1], k[0])),
            "committed_through_ms": self._committed_through_ms,
            "open_drains": sorted(self._open_drains),
        }

    def from_state(self, state: Mapping[str, Any]) -> Self:
        """Replace this probe's backlog with a persisted one (an empty mapping changes nothing)."""
        if not state:
            return self
        check_state_kind(state, "emulator_backlog")
        self._pending = {(str(i), int(p)) for i, p in state.get("pending", ())}
        self._overflow = {int(b): int(n) for b, n in state.get("overflow", ())}
        self._early = {(str(i), int(p)) for i, p in state.get("early", ())}
        self._leased = {(str(i), int(p)): int(at) for i, p, at in state.get("leased", ())}
        through = state.get("committed_through_ms")
        self._committed_through_ms = None if through is None else int(through)
        self._open_drains = {int(at) for at in state.get("open_drains", ())}
        return self

def floor_to(value: int, step: int) -> int:
    return value - value % step


def check_state_kind(state: Mapping[str, Any], kind: str) -> None:
    """Refuse to restore persisted state written by another kind of estimator or probe."""
    if state.get("kind") != kind:
        raise ValueError(f"watermark state of kind {state.get('kind')!r} cannot restore a {kind!r} estimator")
