"""Several synchronous pulls in flight at once, bounded in messages, bytes and time.

One synchronous pull at a time leaves the subscriber idle for a whole round trip per 1,000 messages; a
streaming pull would not (but Google's emulator serves it slowly, DESIGN 9). `pull_concurrently` keeps up to
`streams` pull requests outstanding, each asking only for what the bounds still allow (messages reserved by
requests in flight count against the bound; bytes are reserved at the average size seen so far), and keeps
messages in arrival order until a bound is reached. What a pull brings beyond the bound is handed back to the
caller as `overflow`, to be returned to the subscription (ack deadline 0) for the next batch: nothing is dropped,
nothing is kept twice. A subscription counts as drained only when a pull sent after an empty answer comes back
empty too: a server starved of CPU answers a pull empty now and then while messages wait. A pull cut off by its
timeout ends the pull like an empty answer but is remembered (`cut_off`): the server may have leased messages to
it that never arrived, out of sight until their ack deadline runs out, so such a drain proves nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

MAX_PULL = 1000
FLOWING, SHORT, CONFIRMING = 0, 1, 2


class Sized(Protocol):
    @property
    def size(self) -> int: ...


M = TypeVar("M", bound=Sized)


@dataclass(frozen=True)
class PullBounds:
    """When a concurrent pull stops: `max_messages` / `max_bytes` (None: no bound), `max_seconds` (None: only when
    the subscription is drained), with `streams` pull requests in flight.

    A single message larger than `max_bytes` is still taken, alone: a bound it can never fit would hold it back for
    ever (a poison message)."""

    max_messages: int | None = None
    max_bytes: int | None = None
    max_seconds: float | None = None
    streams: int = 1


@dataclass
class PullOutcome(Generic[M]):
    """`kept` messages within the bounds (arrival order), `overflow` pulled beyond them, `drained` when a pull came
    back empty (the subscription had nothing more to deliver), `cut_off` when a pull timed out instead of answering
    (messages it was leased may wait unseen until their ack deadline: `drained` then does not mean caught up)."""

    kept: list[M] = field(default_factory=list)
    overflow: list[M] = field(default_factory=list)
    drained: bool = False
    cut_off: bool = False

    @property
    def caught_up(self) -> bool:
        """Whether the pull emptied the subscription with every answer seen."""
        return self.drained and not self.cut_off


class _Budget(Generic[M]):
    """The shared state of one concurrent pull: what is kept, what is asked for, whether to stop."""

    def __init__(self, bounds: PullBounds, outcome: PullOutcome[M], kept: Callable[[list[M]], None]) -> None:
        self.bounds, self.outcome, self.on_kept = bounds, outcome, kept
        self.lock = threading.Lock()
        self.bytes = self.reserved = self.reserved_bytes = 0
        self.full = self.short = False
        self.empty_at: float | None = None  # when the first empty answer since the last messages came
        self.deadline = None if bounds.max_seconds is None else time.monotonic() + bounds.max_seconds
        self.first = threading.Event()  # set once one pull has answered: its sizes bound the others' requests

    def stage(self) -> int:
        """How near the end of the subscription the pulls are (`FLOWING`, `SHORT`, `CONFIRMING`)."""
        return CONFIRMING if self.empty_at is not None else SHORT if self.short else FLOWING

    def take(self) -> tuple[int, int, float]:
        """How many messages the next request may ask for and the bytes reserved for them (both held until
        `settle`), and when it is sent; 0 messages to stop."""
        b = self.bounds
        with self.lock:
            now = time.monotonic()
            if self.full or self.outcome.drained or (self.deadline is not None and now >= self.deadline):
                return 0, 0, now
            wanted, reserve = MAX_PULL, 0
            if b.max_messages is not None:
                wanted = min(wanted, b.max_messages - len(self.outcome.kept) - self.reserved)
            if b.max_bytes is not None and self.outcome.kept:
                average = max(1, self.bytes // len(self.outcome.kept))
                wanted = min(wanted, math.ceil((b.max_bytes - self.bytes - self.reserved_bytes) / average))
                reserve = max(0, wanted) * average
            if wanted <= 0:
                return 0, 0, now
            self.reserved += wanted
            self.reserved_bytes += reserve
            return wanted, reserve, now

    def settle(self, wanted: int, reserve: int, sent_at: float, answer: list[M] | None) -> list[M]:
        """Keep what fits of one pull's answer (None: cut off by its timeout, counted as empty); the rest is
        overflow (also returned, to be handed back)."""
        b = self.bounds
        pulled = answer or []
        with self.lock:
            self.outcome.cut_off = self.outcome.cut_off or answer is None
            self.reserved -= wanted
            self.reserved_bytes -= reserve
            if pulled:
                self.empty_at = None
            elif self.empty_at is not None and sent_at >= self.empty_at:
                self.outcome.drained = True
            elif self.empty_at is None:
                self.empty_at = time.monotonic()
            self.short = self.short or len(pulled) < wanted
            fits = 0
            for message in pulled:
                count = len(self.outcome.kept) + fits
                over_count = b.max_messages is not None and count >= b.max_messages
                over_bytes = b.max_bytes is not None and count > 0 and self.bytes + message.size > b.max_bytes
                if self.full or over_count or over_bytes:
                    self.full = True
                    break
                self.bytes += message.size
                fits += 1
            kept, rest = pulled[:fits], pulled[fits:]
            self.outcome.kept.extend(kept)
            self.outcome.overflow.extend(rest)
            self.on_kept(kept)
        self.first.set()
        return rest


def pull_concurrently(
    pull: Callable[[int, int], list[M] | None],
    bounds: PullBounds,
    kept: Callable[[list[M]], None] = lambda _: None,
    overflow: Callable[[list[M]], None] = lambda _: None,
) -> PullOutcome[M]:
    """Pull with `bounds.streams` requests in flight until a bound is reached or a pull comes back empty.

    `pull(n, stage)` makes one synchronous pull of up to `n` messages (an empty list when none came, None when it
    was cut off by its timeout); `stage` is
    `FLOWING`, `SHORT` once a pull came back short, `CONFIRMING` once one came back empty, so that the pulls near
    the end of a drain need not wait long.
    `kept` is told of messages as they are kept (under the budget's lock: e.g. to put them under lease at once),
    `overflow` of those pulled beyond the bounds, from the stream that pulled them.
    """
    outcome: PullOutcome[M] = PullOutcome()
    budget = _Budget(bounds, outcome, kept)

    def stream(index: int) -> None:
        if index:
            budget.first.wait()  # the first answer's sizes bound every later request
        try:
            while (taken := budget.take())[0]:
                try:
                    pulled = pull(taken[0], budget.stage())
                except BaseException:
                    budget.outcome.drained = True  # stops the other streams too
                    budget.settle(*taken, [])
                    raise
                rest = budget.settle(*taken, pulled)
                if rest:
                    overflow(rest)
        finally:
            budget.first.set()

    if bounds.streams <= 1:
        stream(0)
        return outcome
    with ThreadPoolExecutor(bounds.streams, thread_name_prefix="pull") as pool:
        for future in [pool.submit(stream, i) for i in range(bounds.streams)]:
            future.result()
    return outcome
