"""Land: turn what a source offers into an immutable, planned batch before anything is acknowledged.

Pub/Sub: pull a bounded batch under lease, write it as one immutable Parquet landing file, and only then ack.
A crash before the ack means redelivery, which ingest deduplicates. Files: write the list of files (with their
fingerprints) into the batch plan before reading them. Either way, batch `n` is from then on a deterministic
input: every replay reads the same bytes.
"""

from __future__ import annotations

import io
import time

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.pipeline import FileSourceSpec, Pipeline, PubSubSourceSpec
from resources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint
from resources.faults import crash_point
from resources.files import FileSource
from resources.object_store import ObjectStore
from resources.pubsub import PubSubClient, PulledMessage

LANDING_SCHEMA = pa.schema(
    [
        ("ordinal", pa.int64()),
        ("source_position", pa.string()),
        ("publish_time", pa.timestamp("ms", tz="UTC")),
        ("attributes", pa.map_(pa.string(), pa.string())),
        ("data", pa.binary()),
    ]
)


def horizon_floor_ms(pipeline: Pipeline, checkpoint: SourceCheckpoint) -> int | None:
    """Records older than this cannot be checked against the dedup catalog any more."""
    if pipeline.delivery != "exactly_once" or checkpoint.max_event_time_ms is None:
        return None
    return checkpoint.max_event_time_ms - pipeline.dedup_horizon_s * 1000


def landing_key(pipeline: Pipeline, batch_id: int) -> str:
    return f"{pipeline.source_id}/{batch_id:012d}.parquet"


def land_pubsub_batch(
    pipeline: Pipeline, client: PubSubClient, checkpoints: CheckpointStore, landing: ObjectStore
) -> BatchPlan | None:
    """Land the next Pub/Sub batch, or return the already landed one that has not been committed yet.

    Returns None when the subscription has nothing to pull.
    """
    spec = pipeline.source
    assert isinstance(spec, PubSubSourceSpec)
    checkpoint = checkpoints.load()
    batch_id = checkpoint.next_batch
    plan = checkpoints.get_plan(batch_id)
    if plan is not None and landing.exists(plan.landing_key or ""):
        return plan  # landed before a crash: replay it as it is
    with client.pull_batch(spec.subscription, spec.max_messages, spec.max_seconds, spec.ack_deadline_s) as batch:
        if not batch.messages:
            return None
        crash_point("land.before_persist")
        plan = plan or checkpoints.plan(
            BatchPlan(
                batch_id=batch_id,
                kind="pubsub",
                horizon_floor_ms=horizon_floor_ms(pipeline, checkpoint),
                planned_at_ms=int(time.time() * 1000),
                landing_key=landing_key(pipeline, batch_id),
            )
        )
        assert plan.landing_key is not None
        if not landing.create(plan.landing_key, _to_parquet(batch.messages)):
            # Another attempt landed this batch first; ours go back to the subscription for redelivery.
            client.modify_ack_deadline(spec.subscription, batch.ack_ids, 0)
            return plan
        crash_point("land.after_persist")
        client.ack(spec.subscription, batch.ack_ids)
    return plan


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


def plan_file_batch(pipeline: Pipeline, source: FileSource, checkpoints: CheckpointStore) -> BatchPlan | None:
    """Write the next file batch's plan (which files, with fingerprints) before any of them is read.

    Returns the planned-but-uncommitted batch if there is one, None when there are no new files.
    """
    spec = pipeline.source
    assert isinstance(spec, FileSourceSpec)
    checkpoint = checkpoints.load()
    plan = checkpoints.get_plan(checkpoint.next_batch)
    if plan is not None:
        return plan
    files = source.discover(set(checkpoint.taken_files), spec.max_files, spec.max_bytes)
    if not files:
        return None
    return checkpoints.plan(
        BatchPlan(
            batch_id=checkpoint.next_batch,
            kind="files",
            horizon_floor_ms=horizon_floor_ms(pipeline, checkpoint),
            planned_at_ms=int(time.time() * 1000),
            files=tuple(files),
        )
    )


def read_file_batch(plan: BatchPlan, source: FileSource) -> pa.Table:
    """The lines of a file batch in the landing schema; the position is `<relative path>:<byte offset>`."""
    positions, data = [], []
    for entry in plan.files:
        for offset, line in source.lines(entry):
            positions.append(f"{entry.path}:{offset}")
            data.append(line)
    return pa.table(
        {
            "ordinal": list(range(len(data))),
            "source_position": positions,
            "publish_time": pa.nulls(len(data), pa.timestamp("ms", tz="UTC")),
            "attributes": pa.nulls(len(data), pa.map_(pa.string(), pa.string())),
            "data": data,
        },
        schema=LANDING_SCHEMA,
    )
