"""Per-source checkpoints: which batch comes next, what each batch is, how far the source has been committed.

A batch's plan is written once, before the batch is read (`plan`), and never changes: a replay of batch `n`
reads exactly what the first attempt read. The checkpoint proper (`SourceCheckpoint`) changes only by
compare-and-swap (`update`): a writer that lost a race recomputes its change on the winner's checkpoint, so two
overlapping runs never move the committed batch, the watermark or the totals backwards. Both live in an
`ObjectStore`, so they are durable on local disk and on object storage.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from onceflow.resources.files import FileEntry
from onceflow.resources.object_store import ObjectStore


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

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def from_dict(cls, raw: dict) -> BatchPlan:
        return cls(**{**raw, "files": tuple(FileEntry(**f) for f in raw.get("files", ()))})

    @classmethod
    def from_json(cls, data: bytes) -> BatchPlan:
        return cls.from_dict(json.loads(data))


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


CAS_TRIES = 200
SEALED = "sealed"


class EpochSealed(RuntimeError):
    """A batch of an epoch that `onceflow reset` ended: the epoch plans no batch from this one on."""


class CheckpointStore:
    """The checkpoint and batch plans of one source, under `<source_id>/` in an object store.

    `first_batch` is the epoch's first batch number (see `EpochStore`): before any checkpoint, the source has
    committed up to the batch before it.
    """

    def __init__(self, store: ObjectStore, source_id: str, first_batch: int = 1) -> None:
        self.store = store
        self.source_id = source_id
        self.first_batch = first_batch

    def _key(self, name: str) -> str:
        return f"{self.source_id}/{name}"

    def _empty(self) -> SourceCheckpoint:
        return SourceCheckpoint(committed_batch=self.first_batch - 1)

    def load(self) -> SourceCheckpoint:
        data = self.store.read(self._key("checkpoint.json"))
        return SourceCheckpoint.from_json(data) if data else self._empty()

    def update(self, change: Callable[[SourceCheckpoint], SourceCheckpoint | None]) -> SourceCheckpoint:
        """Apply `change` to the newest checkpoint by compare-and-swap and return the checkpoint that stands.

        `change` gets a copy it may modify and return (None: leave the checkpoint as it is). It runs again on the
        newer checkpoint whenever another writer got there first, so it must not have other side effects.
        """
        key = self._key("checkpoint.json")
        for _ in range(CAS_TRIES):
            data, token = self.store.read_versioned(key)
            current = SourceCheckpoint.from_json(data) if data else self._empty()
            changed = change(copy.deepcopy(current))
            if changed is None or changed == current:
                return current
            changed.updated_at_ms = int(time.time() * 1000)
            if self.store.swap(key, changed.to_json(), token):
                return changed
            time.sleep(random.uniform(0, 0.01))  # lost a race: back off a little, then recompute on the winner's
        raise RuntimeError(f"{self.source_id}: gave up updating the checkpoint after {CAS_TRIES} lost races")

    def plan(self, plan: BatchPlan) -> BatchPlan:
        """Record a batch plan once; if one exists already (another attempt won), return that one instead."""
        if self.store.create(self._key(f"batches/{plan.batch_id:012d}.json"), plan.to_json()):
            return plan
        existing = self.get_plan(plan.batch_id)
        assert existing is not None
        return existing

    def get_plan(self, batch_id: int) -> BatchPlan | None:
        """The plan of `batch_id`, None if there is none; `EpochSealed` where a reset ended the epoch."""
        data = self.store.read(self._key(f"batches/{batch_id:012d}.json"))
        plan = BatchPlan.from_json(data) if data else None
        if plan is not None and plan.kind == SEALED:
            raise EpochSealed(f"{self.source_id}: `onceflow reset` ended this epoch before batch {batch_id}; a run "
                              "of the new epoch takes over")
        return plan

    def seal(self, batch_id: int) -> bool:
        """End the epoch at `batch_id`: no batch from it on can ever be planned (a stale run of the epoch fails
        with `EpochSealed`). False, and nothing changed, when `batch_id` is planned already."""
        sealed = BatchPlan(batch_id=batch_id, kind=SEALED, horizon_floor_ms=None, planned_at_ms=int(time.time() * 1000))
        return self.store.create(self._key(f"batches/{batch_id:012d}.json"), sealed.to_json())


class EpochStore:
    """Each pipeline's epoch: 0 until a deliberate reset, then 1, 2, ... Kept apart from the checkpoints (an old
    copy of those restored over them must not roll the epoch back), and only ever increased by compare-and-swap.

    Each epoch records its first batch number: batch numbers continue across epochs (a new epoch's start above
    every batch an earlier one committed), so a raw row's `batch_id` orders it against any pane's close whatever
    epoch either belongs to.
    """

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def _load(self, pipeline: str) -> dict[str, Any]:
        data = self.store.read(f"{pipeline}.json")
        return json.loads(data) if data else {"epoch": 0}

    def current(self, pipeline: str) -> int:
        return int(self._load(pipeline)["epoch"])

    def first_batches(self, pipeline: str) -> list[int]:
        """The first batch number of each epoch so far, by epoch (epoch 0 starts at 1)."""
        state = self._load(pipeline)
        return state.get("first_batches", [1] * (int(state["epoch"]) + 1))

    def advance(self, pipeline: str, first_batch: int) -> int:
        """Start the next epoch of `pipeline`, its batches numbered from `first_batch`, and return its number."""
        key = f"{pipeline}.json"
        for _ in range(CAS_TRIES):
            data, token = self.store.read_versioned(key)
            state = json.loads(data) if data else {"epoch": 0}
            epoch = int(state["epoch"]) + 1
            firsts = [*state.get("first_batches", [1] * epoch), first_batch]
            record = {"epoch": epoch, "first_batches": firsts, "at_ms": int(time.time() * 1000)}
            if self.store.swap(key, json.dumps(record).encode(), token):
                return epoch
        raise RuntimeError(f"{pipeline}: gave up starting a new epoch after {CAS_TRIES} lost races")
