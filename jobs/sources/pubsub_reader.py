"""The reader of a `PubSubSource`: land a bounded pull as one immutable file, and only then acknowledge it.

`next_plan` pulls up to `max_messages` / `max_bytes` / `max_seconds` under lease, with `pull_streams` pull requests
in flight (what comes beyond a bound goes back to the subscription for the next batch), writes the batch plan,
writes the messages kept as one Parquet landing file (create-if-absent), and only then acks exactly those. A crash before the ack means redelivery, which ingest
deduplicates; a crash after the landing file is written replays that file. The watermark is Dataflow's
tracking-subscription heuristic (`PubSubWatermark`), with the base subscription's backlog from Cloud Monitoring
on GCP or, on the emulator (which has no metrics), from what onceflow itself has seen and committed.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.durations import parse_duration
from onceflow.jobs.declare.sources import PubSubSource
from onceflow.jobs.sources.backlog import BacklogProbe, EmulatorBacklogProbe
from onceflow.jobs.sources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint, planned_contract
from onceflow.jobs.sources.cloud_backlog import CloudMonitoringBacklogProbe
from onceflow.jobs.sources.landed_ids import LandedRow
from onceflow.jobs.sources.landing import LANDING_SCHEMA, BatchOutcome
from onceflow.jobs.sources.tracking import TrackingDrainer
from onceflow.jobs.sources.watermark import PubSubWatermark, WatermarkEstimator
from onceflow.resources.faults import fault_point
from onceflow.resources.object_store import ObjectStore
from onceflow.resources.pubsub import PubSubClient, PulledMessage
from onceflow.resources.pubsub_pull import PullBounds


class PubSubReader:
    """See the module docstring; `pipeline.source` is a settings-resolved `PubSubSource`. `client` makes the
    Pub/Sub client when it is first needed; None for work that only reads landed batches."""

    reads_ahead = False  # planning lands and acknowledges messages

    def __init__(
        self,
        pipeline: Pipeline,
        client: Callable[[], PubSubClient] | None,
        checkpoints: CheckpointStore,
        landing: ObjectStore,
    ) -> None:
        source = pipeline.source
        if not isinstance(source, PubSubSource) or source.max_messages is None:
            raise TypeError("PubSubReader needs a settings-resolved PubSubSource")
        self.pipeline, self.source, self.checkpoints, self.landing = pipeline, source, checkpoints, landing
        self._make_client = client
        self._client: PubSubClient | None = None
        self._client_lock = threading.Lock()
        self._landed: dict[int, list[tuple[str, int]]] = {}
        self._acked_drains: list[int] = []  # tracking drains acked since the state last saved

    @property
    def client(self) -> PubSubClient:
        with self._client_lock:  # the tracking drain and the landing may ask for it at once, from two threads
            if self._client is None:
                if self._make_client is None:
                    raise RuntimeError(f"{self.pipeline.source_id}: this work was opened without a Pub/Sub client")
                self._client = self._make_client()
            return self._client

    def has_data(self, checkpoint: SourceCheckpoint) -> bool:
        """Messages wait in the subscription, or a batch landed (and so acknowledged) waits for its commit: a run
        killed between the two leaves its messages in the landing file alone, and no message will come for them."""
        return self.landed_waiting(checkpoint) or self.client.has_messages(self.source.subscription)

    def landed_waiting(self, checkpoint: SourceCheckpoint) -> bool:
        """Whether the checkpoint's next batch is landed: planned, its landing file written, not yet committed."""
        plan = self.checkpoints.get_plan(checkpoint.next_batch)
        return plan is not None and plan.landing_key is not None and self.landing.exists(plan.landing_key)

    def landing_key(self, batch_id: int) -> str:
        return f"{self.checkpoints.source_id}/{batch_id:012d}.parquet"

    def next_plan(
        self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None, proposal: BatchPlan | None = None
    ) -> BatchPlan | None:
        source, batch_id = self.source, checkpoint.next_batch
        plan = self.checkpoints.get_plan(batch_id)
        if plan is not None and self.landing.exists(plan.landing_key or ""):
            return plan  # landed before a crash: replay it as it is
        bounds = PullBounds(source.max_messages, source.max_bytes, source.max_seconds, source.pull_streams or 1)
        with self.client.pull_batch(source.subscription, bounds, source.ack_deadline_s or 60) as batch:
            if not batch.messages:
                return None
            fault_point("land.before_persist")
            plan = plan or self.checkpoints.plan(
                BatchPlan(
                    batch_id=batch_id,
                    kind="pubsub",
                    horizon_floor_ms=horizon_floor_ms,
                    planned_at_ms=int(time.time() * 1000),
                    landing_key=self.landing_key(batch_id),
                    contract=planned_contract(self.pipeline),
                )
            )
            if plan.landing_key is None or not self.landing.create(plan.landing_key, _to_parquet(batch.messages)):
                # Another attempt landed this batch first; ours go back to the subscription for redelivery.
                self.client.modify_ack_deadline(source.subscription, batch.ack_ids, 0, streams=bounds.streams)
                return plan
            fault_point("land.after_persist")
            self.client.ack(source.subscription, batch.ack_ids, streams=bounds.streams)
        return plan

    def landed(self, spark: SparkSession, plan: BatchPlan) -> DataFrame:
        if plan.landing_key is None:
            raise ValueError(f"{self.pipeline.source_id} batch {plan.batch_id} has no landing file")
        return spark.read.parquet(self.landing.url(plan.landing_key))

    def landed_count(self, plan: BatchPlan) -> int:
        return len(self.landed_messages(plan))

    def recount(self, plan: BatchPlan, counted: int) -> int:
        return counted

    def landed_rows(self, plan: BatchPlan) -> list[LandedRow]:
        table = pq.read_table(io.BytesIO(self._landing_bytes(plan)))
        times = table.column("publish_time").cast(pa.int64()).to_pylist()
        return [
            LandedRow(position, dict(attributes or []), data, publish_ms)
            for position, attributes, data, publish_ms in zip(
                table.column("source_position").to_pylist(), table.column("attributes").to_pylist(),
                table.column("data").to_pylist(), times, strict=True,
            )
        ]

    def _landing_bytes(self, plan: BatchPlan) -> bytes:
        data = self.landing.read(plan.landing_key or "")
        if data is None:
            raise FileNotFoundError(f"{self.pipeline.source_id} batch {plan.batch_id}: landing file is missing")
        return data

    def landed_messages(self, plan: BatchPlan) -> list[tuple[str, int]]:
        """(message id, publish time) of every message in a landed batch (read once: it never changes)."""
        if plan.batch_id not in self._landed:
            data = self._landing_bytes(plan)
            table = pq.read_table(io.BytesIO(data), columns=["source_position", "publish_time"])
            times = table.column("publish_time").cast(pa.int64()).to_pylist()
            self._landed[plan.batch_id] = list(zip(table.column("source_position").to_pylist(), times, strict=True))
        return self._landed[plan.batch_id]

    def watermark(self, state: dict) -> PubSubWatermark:
        probe: BacklogProbe
        if self.client.emulated:
            # Twice the ack deadline: a lease a killed drain left has run out before it is forgotten.
            probe = EmulatorBacklogProbe(redelivery_ms=2_000 * (self.source.ack_deadline_s or 60))
        else:
            probe = CloudMonitoringBacklogProbe(self.client.project, self.source.subscription)
        return PubSubWatermark(
            probe,
            band_ms=parse_duration(self.pipeline.watermark_band or "10s") * 1000,
            idle_timeout_ms=parse_duration(self.pipeline.watermark_idle or "120s") * 1000,
        ).from_state(state)

    def before_batch(self, now_ms: int) -> None:
        drainer = TrackingDrainer.for_source(self.client, self.source)
        if self.watermark({}).probe.sees_drains:
            self._save_watermark(lambda watermark: watermark.drain_begun(now_ms))
        drained = drainer.drain(now_ms)
        fault_point("watermark.after_drain")
        # Saved first: only then may the tracking subscription forget them.
        self._save_watermark(lambda watermark: watermark.observe(drained.samples, drained.tracked_through_ms))
        fault_point("watermark.before_ack")
        drainer.ack(drained)
        self._acked_drains.append(drained.started_ms)

    def _save_watermark(self, change: Callable[[PubSubWatermark], None]) -> None:
        """Apply `change` to the checkpoint's watermark (compare-and-swap), with the drains acked since the last save."""

        def changed(checkpoint: SourceCheckpoint) -> SourceCheckpoint:
            watermark = self.watermark(checkpoint.watermark)
            self._report_acked(watermark)
            change(watermark)
            checkpoint.watermark = watermark.to_state()
            return checkpoint

        self.checkpoints.update(changed)
        self._acked_drains = []

    def _report_acked(self, watermark: PubSubWatermark) -> None:
        # Drains this reader acked: saved with the next state, so their redeliveries need not be watched for.
        for drain_started_ms in self._acked_drains:
            watermark.acked(drain_started_ms)

    def after_commit(
        self, watermark: WatermarkEstimator, plan: BatchPlan, outcome: BatchOutcome, now_ms: int
    ) -> None:
        assert isinstance(watermark, PubSubWatermark)
        self._report_acked(watermark)
        watermark.committed(self.landed_messages(plan))

    def after_checkpoint(self, plan: BatchPlan) -> None:
        return None

    def lag(self, plan: BatchPlan) -> dict[str, int]:
        return {}

    def backlog(self, checkpoint: SourceCheckpoint) -> str:
        waiting = self.client.has_messages(self.source.subscription)
        if self.landed_waiting(checkpoint):
            return f"batch {checkpoint.next_batch} landed, not committed" + ("; messages waiting" if waiting else "")
        return "messages waiting" if waiting else "empty"

    def ensure(self) -> str:
        """The topic with its main and tracking subscriptions, created together (a subscription created later
        would miss what was published before it)."""
        source = self.source
        self.client.ensure_subscriptions(source.topic, [source.subscription, source.tracking], source.ack_deadline_s or 60)
        return f"topic {source.topic} with subscriptions {source.subscription}, {source.tracking}"


def _to_parquet(messages: list[PulledMessage]) -> bytes:
    table = pa.table(
        {
            "ordinal": list(range(len(messages))),
            "source_position": [m.message_id for m in messages],
            "publish_time": [m.publish_time_ms for m in messages],
            "attributes": [list(m.attributes.items()) for m in messages],
            "data": [m.data for m in messages],
        },
        schema=LANDING_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
