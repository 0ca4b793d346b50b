"""The watermark of a Kafka source: per partition, the newest event time read minus the out-of-orderness bound;
the source's watermark is the minimum over the partitions that are not idle.

A partition is idle when it brought no record and had nothing waiting (its last stable offset at the end onceflow
committed) for `idle_timeout_ms`: one quiet partition does not stall every window. A partition with records
waiting is never idle, and one whose records were never read holds the watermark where it is: a lagging partition
holds the windows. When every partition is idle the watermark advances to `now_ms - idle_allowance_ms`, as a file
source's does. Monotonic, clock-free and persisted like every estimator in `onceflow.jobs.sources.watermark`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from onceflow.jobs.sources.backlog import check_state_kind
from onceflow.jobs.sources.watermark import BoundedOutOfOrderness


class KafkaWatermark(BoundedOutOfOrderness):
    """See the module docstring."""

    def __init__(self, out_of_orderness_ms: int, **idle: int | None) -> None:
        super().__init__(out_of_orderness_ms, **idle)
        self._max_event_ms: dict[int, int] = {}
        self._active_ms: dict[int, int] = {}  # when each partition last brought records or had some waiting

    def observe(self, max_event_ms: Mapping[int, int | None], now_ms: int) -> None:
        """Partitions that brought records at `now_ms` (or, with None, have records waiting), with the newest
        event time among their valid records."""
        for partition, event_ms in max_event_ms.items():
            if event_ms is not None:
                self._max_event_ms[partition] = max(event_ms, self._max_event_ms.get(partition, event_ms))
            self._active_ms[partition] = max(now_ms, self._active_ms.get(partition, now_ms))

    def current(self, now_ms: int) -> int | None:
        """Compute the watermark at `now_ms`, record it and return it; None before any record."""
        if not self._max_event_ms:
            return self._watermark_ms
        active = [p for p, at in self._active_ms.items() if now_ms - at < self.idle_timeout_ms]
        if any(p not in self._max_event_ms for p in active):
            return self._watermark_ms  # a partition whose records were never read may hold older ones
        if active:
            value = min(self._max_event_ms[p] for p in active) - self.out_of_orderness_ms
        else:
            value = now_ms - self.idle_allowance_ms
        if self._watermark_ms is None or value > self._watermark_ms:
            self._watermark_ms = value
        return self._watermark_ms

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": "kafka",
            "watermark_ms": self._watermark_ms,
            "max_event_time_ms": {str(p): v for p, v in self._max_event_ms.items()},
            "active_ms": {str(p): v for p, v in self._active_ms.items()},
        }

    def from_state(self, state: Mapping[str, Any]) -> Self:
        """Restore a persisted state, never moving anything backward; an empty mapping changes nothing."""
        if not state:
            return self
        check_state_kind(state, "kafka")
        if state.get("watermark_ms") is not None:
            self._watermark_ms = max(int(state["watermark_ms"]), self._watermark_ms or int(state["watermark_ms"]))
        for key, values in (("max_event_time_ms", self._max_event_ms), ("active_ms", self._active_ms)):
            for partition, value in (state.get(key) or {}).items():
                values[int(partition)] = max(int(value), values.get(int(partition), int(value)))
        return self
