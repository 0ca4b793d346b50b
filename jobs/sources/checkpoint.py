"""Per-source checkpoints: which batch comes next, what each batch is, how far the source has been committed.

A batch's plan is written once, before the batch is read (`plan`), and never changes: a replay of batch `n`
reads exactly what the first attempt read. The checkpoint proper (`SourceCheckpoint`) changes only by
compare-and-swap (`update`): a writer that lost a race recomputes its change on the winner's checkpoint, so two
overlapping runs never move the committed batch, the watermark or the totals backwards. Both live in an
`ObjectStore`, so they are durable on local disk and on object storage.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.resources.files import FileEntry
from onceflow.resources.object_store import ObjectStore
from onceflow.resources.stored import Stored


class BatchPlan(Stored):
    """What batch `batch_id` of a source consists of, fixed before the batch is read.

    `landing_key` names the immutable landing file of a Pub/Sub batch; `files` lists the files of a file batch;
    `offsets` the `(partition, from, until)` offset ranges of a Kafka batch, and `lost` the ranges retention had
    deleted before they could be read (under `on_lost_records="dead_letter"`).
    `horizon_floor_ms` is the dedup horizon for this batch: records older than it cannot be checked for
    duplicates any more and are dead-lettered, identically on every replay. `contract` is the record contract the
    batch is classified under (`RecordContract.to_dict`), whatever the declaration says when it is replayed;
    `source_log` names the log the plan reads (Kafka: `<cluster id>/<topic id>[~<generation>]`, see
    `onceflow.jobs.sources.kafka_log`). Both are None in plans made before they were recorded.
    """

    batch_id: int
    kind: str
    horizon_floor_ms: int | None
    planned_at_ms: int
    landing_key: str | None = None
    files: tuple[FileEntry, ...] = ()
    offsets: tuple[tuple[int, int, int], ...] = ()
    lost: tuple[tuple[int, int, int], ...] = ()
    contract: dict[str, Any] | None = None
    source_log: str | None = None
    # Format 2 added `contract` and `source_log`, optional: a format-1 plan reads as it was.
    version: int = 2


def planned_contract(pipeline: Pipeline) -> dict[str, Any]:
    """What a new plan of `pipeline` carries as its contract (`BatchPlan.contract`)."""
    return RecordContract.of(pipeline).to_dict(pipeline.delivery)


class SourceCheckpoint(Stored):
    """The durable position of a source after its last committed batch.

    Not frozen: a change to it (`CheckpointStore.update`) works on a copy it may modify in place."""

    model_config = ConfigDict(frozen=False)

    committed_batch: int = 0
    min_event_time_ms: int | None = None
    max_event_time_ms: int | None = None
    # (batch id, smallest event time) of the newest batches: where late data may have landed (window sensor).
    recent_batches: list[tuple[int, int]] = Field(default_factory=list)
    taken_files: list[str] = Field(default_factory=list)  # the paths of the files batches took, sorted
    totals: dict[str, int] = Field(default_factory=dict)
    watermark: dict[str, Any] = Field(default_factory=dict)
    updated_at_ms: int | None = None

    RECENT_BATCHES: ClassVar[int] = 256
    version: int = 2

    @classmethod
    def upgrade(cls, raw: dict[str, Any], version: int) -> dict[str, Any]:
        # Format 2 keeps only the paths of the files taken: each one's size and hash are in its batch's plan, and
        # with them the checkpoint, read, copied and written by every batch, grew by 130 bytes a file.
        return {**raw, "taken_files": sorted(raw.get("taken_files", {}))}

    @property
    def next_batch(self) -> int:
        return self.committed_batch + 1

    def copied(self) -> SourceCheckpoint:
        """A copy to change, nothing shared (made from this one's values: `copy.deepcopy` took 8 times as long)."""
        return SourceCheckpoint.model_validate(self.model_dump())

    def took(self, files: Iterable[FileEntry]) -> None:
        """Count `files` among the files taken."""
        self.taken_files = sorted({*self.taken_files, *(f.path for f in files)})


class EpochState(Stored):
    """A pipeline's epoch (see `EpochStore`) and the first batch number of each epoch so far, by epoch."""

    epoch: int = 0
    first_batches: tuple[int, ...] = (1,)
    at_ms: int | None = None

    @classmethod
    def upgrade(cls, raw: dict[str, Any], version: int) -> dict[str, Any]:
        # Epochs started before they recorded their first batches all numbered theirs from 1.
        return {"first_batches": [1] * (int(raw.get("epoch", 0)) + 1), **raw}


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
        key = self._key("checkpoint.json")
        data = self.store.read(key)
        return SourceCheckpoint.load(data, self.store.url(key)) if data else self._empty()

    def update(self, change: Callable[[SourceCheckpoint], SourceCheckpoint | None]) -> SourceCheckpoint:
        """Apply `change` to the newest checkpoint by compare-and-swap and return the checkpoint that stands.

        `change` gets a copy it may modify and return (None: leave the checkpoint as it is). It runs again on the
        newer checkpoint whenever another writer got there first, so it must not have other side effects.
        """
        key = self._key("checkpoint.json")
        for _ in range(CAS_TRIES):
            data, token = self.store.read_versioned(key)
            current = SourceCheckpoint.load(data, self.store.url(key)) if data else self._empty()
            changed = change(current.copied())
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

    def replace_plan(self, plan: BatchPlan) -> None:
        """Record `plan` over the stored plan of its batch: only ever the plan the lake committed the batch with
        (a plan is otherwise written once; see `onceflow.jobs.ingest.micro_batch.committed_plan`)."""
        self.store.write(self._key(f"batches/{plan.batch_id:012d}.json"), plan.to_json())

    def get_plan(self, batch_id: int) -> BatchPlan | None:
        """The plan of `batch_id`, None if there is none; `EpochSealed` where a reset ended the epoch."""
        key = self._key(f"batches/{batch_id:012d}.json")
        data = self.store.read(key)
        plan = BatchPlan.load(data, self.store.url(key)) if data else None
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

    def _state(self, key: str, data: bytes | None) -> EpochState:
        return EpochState.load(data, self.store.url(key)) if data else EpochState()

    def _load(self, pipeline: str) -> EpochState:
        return self._state(f"{pipeline}.json", self.store.read(f"{pipeline}.json"))

    def current(self, pipeline: str) -> int:
        return self._load(pipeline).epoch

    def first_batches(self, pipeline: str) -> list[int]:
        """The first batch number of each epoch so far, by epoch (epoch 0 starts at 1)."""
        return list(self._load(pipeline).first_batches)

    def advance(self, pipeline: str, first_batch: int) -> int:
        """Start the next epoch of `pipeline`, its batches numbered from `first_batch`, and return its number."""
        key = f"{pipeline}.json"
        for _ in range(CAS_TRIES):
            data, token = self.store.read_versioned(key)
            state = self._state(key, data)
            epoch = state.epoch + 1
            record = EpochState(epoch=epoch, first_batches=(*state.first_batches, first_batch),
                                at_ms=int(time.time() * 1000))
            if self.store.swap(key, record.to_json(), token):
                return epoch
        raise RuntimeError(f"{pipeline}: gave up starting a new epoch after {CAS_TRIES} lost races")
