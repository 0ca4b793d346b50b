"""Per-source checkpoints: which batch comes next, what each batch is, how far the source has been committed.

A batch's plan is written once, before the batch is read (`plan`), and never changes: a replay of batch `n`
reads exactly what the first attempt read. The checkpoint proper (`SourceCheckpoint`) is replaced atomically
after a batch commits. Both live in an `ObjectStore`, so they are durable on local disk and on object storage.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from resources.object_store import ObjectStore


@dataclass(frozen=True)
class FileEntry:
    """A file as it was when a batch took it: a later change to it is detected, never silently re-read."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class BatchPlan:
    """What batch `batch_id` of a source consists of, fixed before the batch is read.

    `landing_key` names the immutable landing file of a Pub/Sub batch; `files` lists the files of a file batch.
    `horizon_floor_ms` is the dedup horizon for this batch: records older than it cannot be checked for
    duplicates any more and are dead-lettered, identically on every replay.
    """

    batch_id: int
    kind: str
    horizon_floor_ms: int | None
    planned_at_ms: int
    landing_key: str | None = None
    files: tuple[FileEntry, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BatchPlan:
        raw = json.loads(data)
        raw["files"] = tuple(FileEntry(**f) for f in raw.get("files", ()))
        return cls(**raw)


@dataclass
class SourceCheckpoint:
    """The durable position of a source after its last committed batch."""

    committed_batch: int = 0
    min_event_time_ms: int | None = None
    max_event_time_ms: int | None = None
    # (batch id, smallest event time) of the newest batches: where late data may have landed (window sensor).
    recent_batches: list[tuple[int, int]] = field(default_factory=list)
    taken_files: dict[str, FileEntry] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    watermark: dict[str, Any] = field(default_factory=dict)
    updated_at_ms: int | None = None

    RECENT_BATCHES = 256

    @property
    def next_batch(self) -> int:
        return self.committed_batch + 1

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SourceCheckpoint:
        raw = json.loads(data)
        raw["taken_files"] = {k: FileEntry(**v) for k, v in raw.get("taken_files", {}).items()}
        raw["recent_batches"] = [tuple(b) for b in raw.get("recent_batches", [])]
        return cls(**raw)


class CheckpointStore:
    """The checkpoint and batch plans of one source, under `<source_id>/` in an object store."""

    def __init__(self, store: ObjectStore, source_id: str) -> None:
        self.store = store
        self.source_id = source_id

    def _key(self, name: str) -> str:
        return f"{self.source_id}/{name}"

    def load(self) -> SourceCheckpoint:
        data = self.store.read(self._key("checkpoint.json"))
        return SourceCheckpoint.from_json(data) if data else SourceCheckpoint()

    def save(self, checkpoint: SourceCheckpoint) -> None:
        self.store.write(self._key("checkpoint.json"), checkpoint.to_json())

    def plan(self, plan: BatchPlan) -> BatchPlan:
        """Record a batch plan once; if one exists already (another attempt won), return that one instead."""
        if self.store.create(self._key(f"batches/{plan.batch_id:012d}.json"), plan.to_json()):
            return plan
        existing = self.get_plan(plan.batch_id)
        assert existing is not None
        return existing

    def get_plan(self, batch_id: int) -> BatchPlan | None:
        data = self.store.read(self._key(f"batches/{batch_id:012d}.json"))
        return BatchPlan.from_json(data) if data else None
