"""Where a batch's time went: wall-clock milliseconds by stage, as Structured Streaming's `durationMs` says for a
micro-batch. Every batch's `IngestResult` carries them, its Dagster run shows them, and `make bench` reports their
medians per data set.

Stages run on several threads at once (a batch's dead letters are committed beside its valid records; the next
batch is read beside this one's commit), so they overlap, and need not add up to `batch`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STAGES = {
    "read": "the batch's one Spark action: read, parse, validate, classify, its rows to the driver (read ahead: "
            "beside the batch before it)",
    "read_wait": "how long the batch waited for that read (less than `read` when it was read ahead)",
    "dead_letters": "its dead letters explained and committed, on a thread of their own",
    "dedup": "the first record of each ID found, and the ID filters asked which of them the table holds",
    "merge": "without the ID filters: the MERGE that looks the IDs up in the table, writes and commits",
    "write": "its valid rows written and committed to the raw table, as one transaction",
    "checkpoint": "the source's checkpoint advanced (and its watermark)",
    "batch": "the whole batch, from its plan to its checkpoint",
}
"""The stages a batch reports, and what each covers."""


class StageTimes:
    """Wall-clock milliseconds by stage (`STAGES`), added up when a stage runs more than once (a retried commit)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._lock = threading.Lock()  # stages end on several threads

    def add(self, stage: str, seconds: float) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown batch stage {stage!r}; one of {', '.join(STAGES)}")
        with self._lock:
            self.ms[stage] = self.ms.get(stage, 0.0) + seconds * 1000

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Add the `with` block's wall time to `stage`, whether or not it raises."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start)

    def __str__(self) -> str:
        return ", ".join(f"{stage} {self.ms[stage]:.0f} ms" for stage in STAGES if stage in self.ms) or "no stages"

    def __repr__(self) -> str:
        return f"StageTimes({self})"
