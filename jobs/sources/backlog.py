"""The base subscription's backlog for the Pub/Sub watermark: its oldest unacknowledged publish time.

`PubSubWatermark` needs to know how old the oldest message still waiting in the base subscription is. On GCP that
is Cloud Monitoring's `oldest_unacked_message_age` (`CloudMonitoringBacklogProbe`); the emulator has no metrics,
so there `EmulatorBacklogProbe` keeps the backlog from what onceflow itself saw on the tracking subscription and
committed from the base subscription.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, Self, runtime_checkable

from google.api_core.exceptions import GoogleAPIError, PermissionDenied
from google.auth.exceptions import DefaultCredentialsError

from onceflow.jobs.sources.tracking import TrackingSample

DEFAULT_BUCKET_MS = 1_000
log = logging.getLogger("onceflow")
_UNKNOWN = "the Pub/Sub backlog is unknown, so the watermark holds: "

MessageKey = tuple[str, int]
"""A Pub/Sub message as both subscriptions of a topic see it: `(message_id, publish_time_ms)`."""


class BacklogUnknown(Exception):
    """The probe cannot tell the base subscription's backlog now; the message says why."""


@runtime_checkable
class BacklogProbe(Protocol):
    """Where the base (main) subscription's oldest unacknowledged publish time comes from.

    `PubSubWatermark` forwards what it learns to its probe: every tracked sample (`tracked`) and every message the
    pipeline committed (`committed`); a probe that reads the backlog from elsewhere ignores both.
    """

    def oldest_unacked_ms(self, now_ms: int) -> int | None:
        """The oldest publish time still waiting in the base subscription, None when it has no backlog; raises
        `BacklogUnknown` when it cannot tell."""
        ...

    def tracked(self, samples: Sequence[TrackingSample], tracked_through_ms: int | None) -> None:
        """Messages just seen on the tracking subscription, which has seen all published before `tracked_through_ms`."""
        ...

    def committed(self, messages: Iterable[MessageKey]) -> None:
        """Messages of the base subscription that are now committed to the raw table."""
        ...

    def to_state(self) -> dict[str, Any]: ...

    def from_state(self, state: Mapping[str, Any]) -> Self: ...

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
      This drops messages that will never be committed: those lost when the emulator restarted, and the rare
      tracking-subscription redelivery of a message already committed. An expired message that does arrive later
      is still ingested but may be late. Until the pipeline commits newer messages (for instance right after an
      emulator restart, with nothing published since), such an entry holds the watermark back.
    """

    def __init__(
        self, *, max_pending: int = 20_000, expire_after_ms: int = 600_000, bucket_ms: int = DEFAULT_BUCKET_MS
    ) -> None:
        if max_pending < 1 or expire_after_ms < 0 or bucket_ms < 1:
            raise ValueError("max_pending and bucket_ms must be positive and expire_after_ms not negative")
        self.max_pending = max_pending
        self.expire_after_ms = expire_after_ms
        self.bucket_ms = bucket_ms
        self._pending: set[MessageKey] = set()
        self._overflow: dict[int, int] = {}
        self._early: set[MessageKey] = set()
        self._committed_through_ms: int | None = None

    @property
    def pending_count(self) -> int:
        """How many tracked messages are still waiting to be committed (kept by key or only counted)."""
        return len(self._pending) + sum(self._overflow.values())

    def oldest_unacked_ms(self, now_ms: int) -> int | None:
        """The oldest publish time among pending messages, None when there are none (`now_ms` is not needed)."""
        oldest = min((publish for _, publish in self._pending), default=None)
        if self._overflow:
            bucket = min(self._overflow)
            oldest = bucket if oldest is None else min(oldest, bucket)
        return oldest

    def tracked(self, samples: Sequence[TrackingSample], tracked_through_ms: int | None) -> None:
        """Make every sample pending unless the pipeline already committed it."""
        for sample in samples:
            key = (sample.message_id, sample.publish_time_ms)
            if key in self._early:
                self._early.discard(key)
            elif key not in self._pending:
                if len(self._pending) < self.max_pending:
                    self._pending.add(key)
                else:
                    bucket = floor_to(sample.publish_time_ms, self.bucket_ms)
                    self._overflow[bucket] = self._overflow.get(bucket, 0) + 1
        if tracked_through_ms is not None:
            # The tracking subscription has shown everything published before `tracked_through_ms`: an early
            # commit it has not matched well after that was never on it (the margin covers a message whose
            # publish call was still completing when the drain began).
            cutoff = tracked_through_ms - self.expire_after_ms
            self._early = {key for key in self._early if key[1] >= cutoff}

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
            "committed_through_ms": self._committed_through_ms,
        }

    def from_state(self, state: Mapping[str, Any]) -> Self:
        """Replace this probe's backlog with a persisted one (an empty mapping changes nothing)."""
        if not state:
            return self
        check_state_kind(state, "emulator_backlog")
        self._pending = {(str(i), int(p)) for i, p in state.get("pending", ())}
        self._overflow = {int(b): int(n) for b, n in state.get("overflow", ())}
        self._early = {(str(i), int(p)) for i, p in state.get("early", ())}
        through = state.get("committed_through_ms")
        self._committed_through_ms = None if through is None else int(through)
        return self

class CloudMonitoringBacklogProbe:
    """The base subscription's backlog on GCP, from Cloud Monitoring's
    `pubsub.googleapis.com/subscription/oldest_unacked_message_age` (seconds, sampled every 60 s).

    The oldest unacked publish time is the newest sample's time minus its age; an age of 0 means no backlog. The
    metric arrives minutes late, so the answer can be that old: a backlog that cleared since looks older (the
    watermark waits), one that appeared since is not seen yet (the tracking range still bounds the watermark).
    When the query returns no sample, or cannot be made (no credentials, no permission, the API unreachable), the
    backlog is unknown (`BacklogUnknown`), never "no backlog": the watermark then stays where it is. A query that
    cannot be made is reported as one error line on the `onceflow` logger naming the fix, not a traceback.

    Needs `google-cloud-monitoring` (the `gcp` extra) and, for the pipeline's identity, `roles/monitoring.viewer`
    on the project. A `client` (a `monitoring_v3.MetricServiceClient` or anything with its `list_time_series`)
    replaces the one made from Application Default Credentials. The probe keeps no state worth persisting:
    `tracked` and `committed` do nothing and `to_state` is just its kind.
    """

    METRIC = "pubsub.googleapis.com/subscription/oldest_unacked_message_age"

    def __init__(
        self, project: str, subscription: str, *, lookback_ms: int = 600_000, client: Any = None
    ) -> None:
        self.project = project
        self.subscription = subscription
        self.lookback_ms = lookback_ms
        self._client = client

    def query_filter(self) -> str:
        """The Cloud Monitoring filter selecting this subscription's metric."""
        return (
            f'metric.type = "{self.METRIC}" AND resource.type = "pubsub_subscription" '
            f'AND resource.labels.subscription_id = "{self.subscription}"'
        )

    def oldest_unacked_ms(self, now_ms: int) -> int | None:
        """Query the metric over `[now_ms - lookback_ms, now_ms]` and return the newest sample's reading; raises
        `BacklogUnknown` when there is no sample or the query cannot be made."""
        try:
            series = self._query(now_ms)
        except BacklogUnknown as unknown:
            log.error("%s", unknown)
            raise
        newest: tuple[int, int] | None = None
        for one in series:
            for point in one.points:
                at_ms = round(point.interval.end_time.timestamp() * 1000)
                if newest is None or at_ms > newest[0]:
                    newest = (at_ms, int(point.value.int64_value))
        if newest is None:
            raise BacklogUnknown(f"Cloud Monitoring has no {self.METRIC} sample for {self.subscription} in the "
                                 f"last {self.lookback_ms // 1000} s")
        at_ms, age_s = newest
        return None if age_s <= 0 else at_ms - age_s * 1000

    def _query(self, now_ms: int) -> list[Any]:
        role = f"roles/monitoring.viewer on project {self.project}"
        try:
            if self._client is None:
                from google.cloud import monitoring_v3  # the `gcp` extra: only needed on GCP

                self._client = monitoring_v3.MetricServiceClient()
            start_ms = now_ms - self.lookback_ms
            return list(self._client.list_time_series(  # every page, within the errors handled below
                request={
                    "name": f"projects/{self.project}",
                    "filter": self.query_filter(),
                    "interval": {
                        "start_time": {"seconds": start_ms // 1000, "nanos": start_ms % 1000 * 1_000_000},
                        "end_time": {"seconds": now_ms // 1000, "nanos": now_ms % 1000 * 1_000_000},
                    },
                }
            ))
        except ImportError:
            raise BacklogUnknown(
                _UNKNOWN + "google-cloud-monitoring is not installed: pip install 'onceflow[gcp]'"
            ) from None
        except DefaultCredentialsError:
            raise BacklogUnknown(
                _UNKNOWN + "no Google credentials: run `gcloud auth application-default login`, set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run as a service account; it "
                f"needs {role}"
            ) from None
        except PermissionDenied:
            raise BacklogUnknown(_UNKNOWN + f"permission denied: grant the pipeline's identity {role}") from None
        except GoogleAPIError as error:
            raise BacklogUnknown(_UNKNOWN + f"Cloud Monitoring failed: {error}") from None

    def tracked(self, samples: Sequence[TrackingSample], tracked_through_ms: int | None) -> None:
        return None

    def committed(self, messages: Iterable[MessageKey]) -> None:
        return None

    def to_state(self) -> dict[str, Any]:
        return {"kind": "cloud_monitoring_backlog"}

    def from_state(self, state: Mapping[str, Any]) -> Self:
        if state:
            check_state_kind(state, "cloud_monitoring_backlog")
        return self


def floor_to(value: int, step: int) -> int:
    return value - value % step


def check_state_kind(state: Mapping[str, Any], kind: str) -> None:
    """Refuse to restore persisted state written by another kind of estimator or probe."""
    if state.get("kind") != kind:
        raise ValueError(f"watermark state of kind {state.get('kind')!r} cannot restore a {kind!r} estimator")
