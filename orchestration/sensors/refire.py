"""Refires under `late_policy="refire"`: which closed windows got rows after their close, asked for across ticks
without losing one.

A batch's late rows are in window `W` when the batch's valid records touch `W` (the minutes of event time each
batch keeps, `onceflow.jobs.sources.manifests`) and `W`'s newest pane closed before the batch (its `max_batch_id`
below the batch): only those windows are asked for, a stray old record asks for its own window alone. Batches are
looked at in order, as many a tick as `BATCHES_PER_TICK`; each window found goes on a queue in the sensor's
cursor, and the queue is asked for as the tick's run requests allow: a tick full of final panes, or a catch-up of
thousands of batches, delays refires and never drops one. A batch committed before batches kept their minutes is
looked at the coarse way: every closed window from its oldest event time on (the checkpoint's `recent_batches`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
from onceflow.jobs.sources.checkpoint import EpochStore, SourceCheckpoint
from onceflow.jobs.sources.manifests import ManifestStore
from onceflow.jobs.sources.reader import app_id
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.resources.lake import LakeResource

BATCHES_PER_TICK = 200
QUEUE_LIMIT = 2000
"""Past this many windows waiting, no new batch is looked at until the queue is asked for."""


@dataclass
class RefireCursor:
    """The refire part of a window sensor's cursor: the last batch looked at, and the windows (start ms) waiting to
    be asked for, oldest first."""

    seen_batch: int = 0
    queue: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, cursor: dict) -> RefireCursor:
        return cls(int(cursor.get("seen_batch", 0)), [int(s) for s in cursor.get("refire_queue", [])])

    def to_dict(self) -> dict:
        return {"seen_batch": self.seen_batch, "refire_queue": self.queue}


def minutes_of(pipeline: Pipeline, lake: LakeResource) -> Callable[[int], list[tuple[int, int]] | None]:
    """A batch's minutes of event time, from the manifests of the epoch it belongs to."""
    firsts = EpochStore(lake.epochs()).first_batches(pipeline.name)

    def minutes(batch: int) -> list[tuple[int, int]] | None:
        epoch = max([i for i, first in enumerate(firsts) if first <= batch], default=0)
        return ManifestStore(lake.manifests(), app_id(pipeline, epoch)).minutes(batch)

    return minutes


def look_at_batches(
    cursor: RefireCursor, checkpoint: SourceCheckpoint, output: WindowedOutput, closes: CloseStore,
    minutes_of: Callable[[int], list[tuple[int, int]] | None], span_ms: tuple[int, int], pending: dict[str, dict],
) -> None:
    """Look at the batches committed since the cursor's (up to `BATCHES_PER_TICK`, while the queue has room) and
    queue the closed windows each brought late rows to. A `pending` window a batch touches (its run may have read
    raw before the batch) is marked to be asked for again once its run has ended. `span_ms`: the pipeline's first
    window's start, and the end of the windows asked for so far."""
    last = min(checkpoint.committed_batch, cursor.seen_batch + BATCHES_PER_TICK)
    oldest, closed = dict(checkpoint.recent_batches), _Closed(closes, output.window_s)
    for batch in range(cursor.seen_batch + 1, last + 1):
        if len(cursor.queue) >= QUEUE_LIMIT:
            break
        for window in _touched(output, closed, minutes_of(batch), oldest.get(batch), span_ms):
            if window.key in pending:
                pending[window.key] = {**pending[window.key], "again": True}
                continue
            close = closes.latest(window)
            if close is not None and close.max_batch_id < batch and window.start_ms not in cursor.queue:
                cursor.queue.append(window.start_ms)  # closed before the batch: its rows are late there
        cursor.seen_batch = batch


class _Closed:
    """The output's closed windows, listed once a tick and only if asked."""

    def __init__(self, closes: CloseStore, window_s: int) -> None:
        self.closes, self.window_s, self._starts = closes, window_s, None

    def starts(self) -> list[int]:
        if self._starts is None:
            self._starts = [w.start_ms for w in self.closes.windows(self.window_s)]
        return self._starts


WINDOWS_SPELLED_OUT = 10_000


def _touched(
    output: WindowedOutput, closed: _Closed, minutes: list[tuple[int, int]] | None, oldest_ms: int | None,
    span_ms: tuple[int, int],
) -> list[Window]:
    """The windows of `output` a batch's valid records fall in (from its `minutes`; where they span more windows
    than `WINDOWS_SPELLED_OUT`, the closed ones among them), or the coarse way (from its oldest event time, every
    window asked for since, the newest `WINDOWS_SPELLED_OUT`); none before the pipeline's first window."""
    first_ms, asked_until_ms = span_ms
    size_ms, size_min = output.window_s * 1000, output.window_s // 60
    if minutes is None:
        if oldest_ms is None:
            return []
        since = max(Window.at(max(oldest_ms, first_ms), output.window_s).start_ms, asked_until_ms - WINDOWS_SPELLED_OUT * size_ms)
        return [Window(s, s + size_ms) for s in range(since, asked_until_ms, size_ms)]
    spans = [(first // size_min, last // size_min) for first, last in minutes]
    if sum(b - a + 1 for a, b in spans) > WINDOWS_SPELLED_OUT:
        held = [s for s in closed.starts() if any(a <= s // 60_000 // size_min <= b for a, b in spans)]
        return [Window(s, s + size_ms) for s in held if s >= first_ms]
    starts = sorted({w * size_min * 60_000 for a, b in spans for w in range(a, b + 1)})
    return [Window(s, s + size_ms) for s in starts if s >= first_ms]
