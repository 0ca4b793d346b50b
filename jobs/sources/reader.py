"""A pipeline's source at run time, as one interface: has it data, what is the next batch, what did a batch
land, and how does its watermark learn.

`open_source` wires a declared source (`PubSubSource`, `FileSource`, `KafkaSource`) to its reader, its checkpoint
store and its tables under the lake; nothing else in the platform needs to know which kind of source it is.

Every reader lands a batch in one schema (`onceflow.jobs.sources.landing.LANDING_SCHEMA`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.sources import FileSource, KafkaSource
from onceflow.jobs.dedup.buckets import BATCH_RANGES
from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.sources.checkpoint import BatchPlan, CheckpointStore, EpochStore, SourceCheckpoint
from onceflow.jobs.sources.committed_plans import CommittedPlans
from onceflow.jobs.sources.file_reader import FileReader
from onceflow.jobs.sources.kafka_reader import KafkaReader
from onceflow.jobs.sources.landed_ids import LandedRow
from onceflow.jobs.sources.landing import BatchOutcome
from onceflow.jobs.sources.manifests import ManifestStore
from onceflow.jobs.sources.pubsub_reader import PubSubReader
from onceflow.jobs.sources.read_ahead import ReadAhead
from onceflow.jobs.sources.watermark import WatermarkEstimator
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubClient


class SourceReader(Protocol):
    """What a micro-batch needs from its source."""

    def has_data(self, checkpoint: SourceCheckpoint) -> bool:
        """Whether new data waits, including a batch planned and not yet committed (a scheduling hint; it changes
        nothing). Raises the error that stops the source, when one does (`KafkaLogChanged`)."""
        ...

    reads_ahead: bool
    """Whether the next batch can be proposed (`propose`) and read before this one commits: its planning has no
    effect beside the plan (Pub/Sub's lands and acknowledges messages)."""

    def next_plan(
        self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None, proposal: BatchPlan | None = None
    ) -> BatchPlan | None:
        """The planned-but-uncommitted batch if there is one, else plan (and, for Pub/Sub, land and ack) the
        next; None when there is nothing new. A plan is durable before anything is acknowledged. `proposal`
        (`reads_ahead` only): the plan the next batch was read ahead for, recorded instead when it is the same."""
        ...

    def propose(self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None) -> BatchPlan | None:
        """`reads_ahead` only: the plan `next_plan` would make now, recorded nowhere."""
        ...

    def landed(self, spark: SparkSession, plan: BatchPlan) -> DataFrame:
        """The batch's records in `LANDING_SCHEMA`: the same bytes on every replay."""
        ...

    def landed_count(self, plan: BatchPlan) -> int:
        """How many records the batch holds, counted from the landing itself (not from Spark's reading of it).
        Where that would be a second read of every record (Kafka), the number of positions planned: exact unless
        some of them hold no record, see `recount`."""
        ...

    def recount(self, plan: BatchPlan, counted: int) -> int:
        """The batch's records counted again from the landing, asked only where Spark's reading of it saw another
        number than `landed_count`'s `counted`; `counted` itself where that count is always exact."""
        ...

    def landed_rows(self, plan: BatchPlan) -> list[LandedRow]:
        """The batch's records read in plain Python, for reconciliation (not Spark's reading of them)."""
        ...

    def watermark(self, state: dict) -> WatermarkEstimator:
        """The source's watermark estimator, restored from its persisted state."""
        ...

    def before_batch(self, now_ms: int) -> None:
        """Persist in the checkpoint's watermark state what the estimator must learn before a batch commits
        (Pub/Sub: what the tracking subscription shows, persisted before it is acknowledged). It runs in its own
        thread beside `next_plan` and the ingest, and its checkpoint changes are compare-and-swap like theirs."""
        ...

    def after_commit(
        self, watermark: WatermarkEstimator, plan: BatchPlan, outcome: BatchOutcome, now_ms: int
    ) -> None:
        """Feed the estimator a committed batch. May run more than once per batch (a lost checkpoint race):
        it changes nothing but the estimator: it also runs on a copy, to propose the batch after an uncommitted one
        (`onceflow.jobs.sources.read_ahead`)."""
        ...

    def after_checkpoint(self, plan: BatchPlan) -> None:
        """Told once the checkpoint holds batch `plan` committed: what only tools outside onceflow read (Kafka: the
        consumer group's offsets, for lag tools). Best effort, never read back."""
        ...

    def lag(self, plan: BatchPlan) -> dict[str, int]:
        """What waits in the source past batch `plan`, per stream (Kafka: per partition), for a run's metadata;
        empty where it cannot be told cheaply."""
        ...

    def backlog(self, checkpoint: SourceCheckpoint) -> str:
        """What waits in the source, in words, for `onceflow status`."""
        ...

    def ensure(self) -> str:
        """Create what the source reads from if it is missing (a development convenience); says what it is."""
        ...


@dataclass(frozen=True)
class SourceRuntime:
    """A pipeline's source with everything a micro-batch touches: reader, checkpoints, tables.

    `app_id` names the source in its current epoch: the Delta `txnAppId` of its commits and the key of its
    checkpoints and landing files (`<pipeline>/<kind>`, then `<pipeline>/<kind>@<epoch>` after a reset). Batch
    numbers go on across epochs: an epoch's first batch is above every batch of the epochs before it.
    `manifests` keeps what each batch landed, for reconciliation after its source lets it go.
    `id_filters` and `dead_letter_filters` keep the fingerprints of the IDs the raw and dead-letter tables hold
    (None: the lake's fast path is off, or, for raw, the pipeline is at-least-once). `read_ahead` holds the next
    batch's read while a batch commits (`onceflow.jobs.sources.read_ahead`).
    """

    pipeline: Pipeline
    app_id: str
    reader: SourceReader
    checkpoints: CheckpointStore
    plans: CommittedPlans
    raw_path: str
    dead_letter_path: str
    manifests: ManifestStore
    id_filters: IdFilterStore | None = None
    dead_letter_filters: IdFilterStore | None = None
    read_ahead: ReadAhead = field(default_factory=ReadAhead, compare=False)

    @property
    def epoch(self) -> int:
        """The source's epoch (`app_id`'s `@<epoch>`, 0 before any reset)."""
        _, at, epoch = self.app_id.rpartition("@")
        return int(epoch) if at else 0


def app_id(pipeline: Pipeline, epoch: int) -> str:
    return pipeline.source_id if epoch == 0 else f"{pipeline.source_id}@{epoch}"


def open_source(
    pipeline: Pipeline, lake: LakeResource, pubsub: Callable[[], PubSubClient] | None = None, epoch: int | None = None
) -> SourceRuntime:
    """Wire a (settings-resolved) pipeline's source to its reader, checkpoints and tables under `lake`, in its
    current epoch (or in `epoch`, an earlier one, to read what it landed).

    `pubsub` makes a Pub/Sub client when a Pub/Sub source first needs one; None for work that only reads what
    was landed (reconciliation).
    """
    epochs = EpochStore(lake.epochs())
    epoch = epochs.current(pipeline.name) if epoch is None else epoch
    source_app = app_id(pipeline, epoch)
    first_batches = epochs.first_batches(pipeline.name)
    checkpoints = CheckpointStore(lake.checkpoints(), source_app, first_batches[epoch])
    raw, dead = lake.table_path(pipeline.raw_table), lake.table_path(pipeline.dead_letter_table)
    plans = CommittedPlans(checkpoints, source_app, raw, dead)
    reader: SourceReader
    if isinstance(pipeline.source, FileSource):
        reader = FileReader(pipeline, checkpoints)
    elif isinstance(pipeline.source, KafkaSource):
        previous = None
        if epoch > 0:  # where this epoch's first plan goes on
            before = app_id(pipeline, epoch - 1)
            previous = CommittedPlans(CheckpointStore(lake.checkpoints(), before, first_batches[epoch - 1]), before,
                                      raw, dead)
        reader = KafkaReader(pipeline, checkpoints, plans, previous)
    else:
        reader = PubSubReader(pipeline, pubsub, checkpoints, lake.landing())
    filters = None
    if lake.id_filters and pipeline.delivery == "exactly_once":
        filters = IdFilterStore(lake.filters(), pipeline.raw_table, raw)
    # Dead letters are held once per ID in either delivery mode.
    dead_filters = IdFilterStore(lake.filters(), pipeline.dead_letter_table, dead, BATCH_RANGES) if lake.id_filters \
        else None
    manifests = ManifestStore(lake.manifests(), source_app)
    return SourceRuntime(pipeline, source_app, reader, checkpoints, plans, raw, dead, manifests, filters, dead_filters)


def source_watermark_ms(checkpoint: SourceCheckpoint) -> int | None:
    """The source's event-time watermark as of its last checkpoint, None before any."""
    value = checkpoint.watermark.get("watermark_ms")
    return None if value is None else int(value)
