"""The watermark of a Kafka source: per partition, the newest event time read minus the out-of-orderness bound;
the source's watermark is the minimum over the partitions that hold it.

A partition holds the watermark while, within the last `idle_timeout_ms`, it

- brought a valid record (an event time);
- had records waiting past the end onceflow committed, unless everything it brought over that whole time was
  invalid (no event time at all: a partition of only malformed lines would otherwise freeze every window);
- had a transaction open: its high watermark above its last stable offset, so records nobody can read yet may be
  older than what the other partitions say (Kafka's own consumers and Flink hold the watermark there too).

A partition holding the watermark whose records were never read (no event time known) holds it where it is. When no
partition holds it, the watermark advances to `now_ms - idle_allowance_ms`, as a file source's does. Monotonic,
clock-free and persisted like every estimator in `onceflow.jobs.sources.watermark`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Self

from onceflow.jobs.sources.backlog import check_state_kind
from onceflow.jobs.sources.watermark import BoundedOutOfOrderness

_TIMES = ("max_event_time_ms", "valid_ms", "waiting_ms", "open_ms")


class KafkaWatermark(BoundedOutOfOrderness):
    """See the module docstring."""

    def __init__(self, out_of_orderness_ms: int, **idle: int | None) -> None:
        super().__init__(out_of_orderness_ms, **idle)
        self._times: dict[str, dict[int, int]] = {name: {} for name in _TIMES}
        self._invalid_since_ms: dict[int, int] = {}  # since when each partition brought records, none valid

    def observe(
        self, read: Mapping[int, int | None], now_ms: int, waiting: Iterable[int] = (), open_: Iterable[int] = ()
    ) -> None:
        """At `now_ms`: the partitions a batch read, each with the newest event time among its valid records (None:
        none was valid); those with records `waiting` past the batch; those with a transaction open (`open_`)."""
        for partition, event_ms in read.items():
            if event_ms is None:
                self._invalid_since_ms.setdefault(partition, now_ms)
                continue
            self._later("max_event_time_ms", partition, event_ms)
            self._later("valid_ms", partition, now_ms)
            self._invalid_since_ms.pop(partition, None)
        for partition in waiting:
            self._later("waiting_ms", partition, now_ms)
        for partition in open_:
            self._later("open_ms", partition, now_ms)

    def _later(self, name: str, partition: int, value: int) -> None:
        times = self._times[name]
        times[partition] = max(value, times.get(partition, value))

    def _holds(self, partition: int, now_ms: int) -> bool:
        def recent(name: str) -> bool:
            at = self._times[name].get(partition)
            return at is not None and now_ms - at < self.idle_timeout_ms

        invalid_since = self._invalid_since_ms.get(partition)
        only_invalid = invalid_since is not None and now_ms - invalid_since >= self.idle_timeout_ms
        return recent("open_ms") or recent("valid_ms") or (recent("waiting_ms") and not only_invalid)

    def current(self, now_ms: int) -> int | None:
        """Compute the watermark at `now_ms`, record it and return it; None before any record."""
        newest = self._times["max_event_time_ms"]
        if not newest:
            return self._watermark_ms
        known = {p for times in self._times.values() for p in times} | set(self._invalid_since_ms)
        holding = [p for p in known if self._holds(p, now_ms)]
        if any(p not in newest for p in holding):
            return self._watermark_ms  # a partition whose records were never read may hold older ones
        if holding:
            value = min(newest[p] for p in holding) - self.out_of_orderness_ms
        else:
            value = now_ms - self.idle_allowance_ms
        if self._watermark_ms is None or value > self._watermark_ms:
            self._watermark_ms = value
        return self._watermark_ms

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": "kafka",
            "watermark_ms": self._watermark_ms,
            **{name: {str(p): v for p, v in times.items()} for name, times in self._times.items()},
            "invalid_since_ms": {str(p): v for p, v in self._invalid_since_ms.items()},
        }

    def from_state(self, state: Mapping[str, Any]) -> Self:
        """Restore a persisted state, never moving anything backward; an empty mapping changes nothing. A state
        written before validity and transactions were told apart (`active_ms`: records brought or waiting) reads
        each partition's last activity as both."""
        if not state:
            return self
        check_state_kind(state, "kafka")
        if state.get("watermark_ms") is not None:
            self._watermark_ms = max(int(state["watermark_ms"]), self._watermark_ms or int(state["watermark_ms"]))
        legacy = state.get("active_ms") or {}
        for name in _TIMES:
            for partition, value in (state.get(name) or (legacy if name in ("valid_ms", "waiting_ms") else {})).items():
                self._later(name, int(partition), int(value))
        for partition, since in (state.get("invalid_since_ms") or {}).items():
            self._invalid_since_ms.setdefault(int(partition), int(since))
        return self
