"""Event-time windows and their panes: which window a partition key names, and the durable pane closes.

A window `[start, end)` closes when the source watermark passes `end + allowed_lateness`. Closing records, once,
the raw table's Delta version `v` (a `PaneClose`); the pane's result is computed from `raw VERSION AS OF v`, so
every retry and every backfill computes the same rows. Pane 0 is an early pane (recomputed from the latest
version until the window closes), pane 1 the on-time pane fixed at the close, and under the `refire` late policy
panes 2, 3, ... are late panes closed at newer versions when late records arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from onceflow.resources.object_store import ObjectStore
from onceflow.resources.stored import Stored

PARTITION_FORMAT = "%Y-%m-%d-%H:%M"
EARLY, ON_TIME, LATE = "early", "on_time", "late"


@dataclass(frozen=True)
class Window:
    """An event-time window `[start_ms, end_ms)`."""

    start_ms: int
    end_ms: int

    @classmethod
    def from_partition_key(cls, key: str, window_s: int) -> Window:
        start = datetime.strptime(key, PARTITION_FORMAT).replace(tzinfo=UTC)
        start_ms = int(start.timestamp() * 1000)
        return cls(start_ms, start_ms + window_s * 1000)

    @classmethod
    def at(cls, time_ms: int, window_s: int) -> Window:
        """The window of `window_s` seconds holding `time_ms` (windows are aligned to the epoch, in UTC)."""
        size = window_s * 1000
        start = time_ms // size * size
        return cls(start, start + size)

    @property
    def key(self) -> str:
        return datetime.fromtimestamp(self.start_ms / 1000, UTC).strftime(PARTITION_FORMAT)

    def next(self) -> Window:
        return Window(self.end_ms, 2 * self.end_ms - self.start_ms)


def first_window_start_ms(start_date: str) -> int:
    """Where a pipeline's first window starts: midnight UTC of its `start_date` (`YYYY-MM-DD`), a window boundary
    for every window size (each divides a day)."""
    return int(datetime.strptime(start_date, "%Y-%m-%d").replace(tzinfo=UTC).timestamp() * 1000)


class PaneClose(Stored):
    """The durable record that pane `pane` of a window was closed at raw version `raw_version`.

    `max_batch_id` is the newest batch in raw at that version: rows of later batches are late.
    """

    window_start_ms: int
    pane: int
    timing: str
    raw_version: int
    max_batch_id: int
    watermark_ms: int | None
    closed_at_ms: int


class CloseStore:
    """Pane closes of one window asset; each is written once and never changes."""

    def __init__(self, store: ObjectStore, asset: str) -> None:
        self.store = store
        self.asset = asset

    def _prefix(self, window: Window) -> str:
        return f"{self.asset}/closes/{window.start_ms:015d}/"

    def latest(self, window: Window) -> PaneClose | None:
        keys = self.store.list(self._prefix(window))
        if not keys:
            return None
        data = self.store.read(keys[-1])
        return PaneClose.load(data, self.store.url(keys[-1])) if data else None

    def windows(self, window_s: int) -> list[Window]:
        """Every window with a close, oldest first."""
        starts = sorted({int(k.split("/")[-2]) for k in self.store.list(f"{self.asset}/closes/")})
        return [Window(start, start + window_s * 1000) for start in starts]

    def close(self, window: Window, close: PaneClose) -> PaneClose:
        """Record `close` unless that pane was closed already; return the close that stands."""
        key = f"{self._prefix(window)}pane-{close.pane:04d}.json"
        if self.store.create(key, close.to_json()):
            return close
        data = self.store.read(key)
        if data is None:
            raise RuntimeError(f"{self.asset} window {window.key}: pane close {key} vanished")
        return PaneClose.load(data, self.store.url(key))
