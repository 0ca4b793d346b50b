"""Publish a record output: each committed raw batch's records, staged, then written to every sink by a commit
sequence (`onceflow.jobs.publish.sequence`), exactly once per (pipeline, output, epoch, batch).

`stage_batch` reads the records batch n inserted (`batch_id = n` in the files its own commit added to the raw
table: stable input, read at the cost of the batch alone), applies the output's transform, writes the result as a
Parquet file under `<staging>/records/` and the sequence `<output>:epoch-<e>:batch-<n>`: a `RecordWrite` per
sink, then `StagedDrop`. Nothing reaches a sink before the sequence is written; once it is, the ingest run (then,
if that run dies, the commit sensor's finalize run) drives it.

Which batches are staged: the commit store keeps, per record output, the last batch staged (its "published"
mark, only ever growing). After each raw commit the run stages every batch of its epoch after that mark up to
the one it committed, so a run that died between a raw commit and staging loses no batch: the next commit
stages both. An output first seen by a run starts after the raw table's last committed batch (it publishes what
comes from then on).
"""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.record_output import RECORD_COLUMNS, RecordOutput
from onceflow.jobs.delta.batch_rows import inserted_rows, own_version
from onceflow.jobs.delta.commit_log import batch_versions, committed_batch
from onceflow.jobs.publish.commit_records import (
    DEFAULT_MAX_ATTEMPTS,
    SequenceRecord,
    asset_key_part,
    checked_sequence_id,
)
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_steps import RecordWrite, StagedDrop
from onceflow.jobs.publish.sequence import CommitSequence
from onceflow.jobs.publish.step import CommitStep, sha256_hex
from onceflow.resources.faults import fault_point
from onceflow.resources.object_store import open_store


def record_sequence_id(asset: str, epoch: int, batch: int) -> str:
    """The id of the sequence publishing batch `batch` (of epoch `epoch`) to record output `asset`."""
    return checked_sequence_id(f"{asset_key_part(asset)}:epoch-{epoch}:batch-{batch:012d}")


@dataclass(frozen=True)
class RawBatches:
    """Where a record output reads its batches: the pipeline's raw table at `raw_path`, committed by `app_id` (the
    source in its epoch `epoch`)."""

    pipeline: Pipeline
    raw_path: str
    app_id: str
    epoch: int


def start_output(store: CommitStore, output: RecordOutput, raw: RawBatches, first_batch: int) -> None:
    """Give an output seen for the first time its starting mark: the raw table's last batch of this epoch (or the
    one before the epoch's `first_batch`)."""
    if store.published_through(output.asset) is None:
        held = committed_batch(raw.raw_path, raw.app_id)
        store.record_published(output.asset, held if held is not None else first_batch - 1)


def stage_through(
    spark: SparkSession, store: CommitStore, staging_root: str, output: RecordOutput, raw: RawBatches, batch: int,
    version: int | None = None,
) -> list[tuple[str, int, int]]:
    """Stage every batch after the output's mark through `batch` (whose commit is version `version`, when known);
    (sequence id, batch, rows) of each, in batch order (written now or before)."""
    mark = store.published_through(output.asset)
    wanted = list(range((mark or 0) + 1, batch + 1))
    if not wanted:
        return []
    fault_point("publish.before_stage")
    versions = batch_versions(raw.raw_path, raw.app_id, wanted[:-1]) if len(wanted) > 1 else {}
    own = own_version(raw.raw_path, raw.app_id, batch, version)
    if own is None:
        raise RuntimeError(f"{raw.raw_path}: no commit of batch {batch} of {raw.app_id} to publish")
    versions[batch] = own
    staged = []
    for number in wanted:
        if number not in versions:
            continue  # not committed in this epoch (a batch number an earlier epoch's reset never used)
        staged.append(stage_batch(spark, store, staging_root, output, raw, number, versions[number]))
        store.record_published(output.asset, number)
    return staged


def stage_batch(
    spark: SparkSession, store: CommitStore, staging_root: str, output: RecordOutput, raw: RawBatches, batch: int,
    version: int, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> tuple[str, int, int]:
    """Write batch `batch`'s publication (its rows staged, then its sequence) unless it is written; (its id, the
    batch, its rows)."""
    seq_id = record_sequence_id(output.asset, raw.epoch, batch)
    existing = store.get(seq_id)
    if existing is not None:
        return seq_id, batch, staged_rows(existing)
    rows = publication_rows(spark, raw, output, batch, version)
    buffer = io.BytesIO()
    pq.write_table(rows, buffer)
    data = buffer.getvalue()
    key = f"records/{asset_key_part(output.asset)}/epoch={raw.epoch}/batch={batch:012d}.{uuid.uuid4().hex[:12]}.parquet"
    staging = open_store(staging_root)
    staging.write(key, data)
    steps: list[CommitStep] = [
        RecordWrite(asset=output.asset, sink=sink.name, pipeline=raw.pipeline.name, epoch=raw.epoch, batch=batch,
                    staged_root=staging_root, staged_key=key, sha256=sha256_hex(data), rows=rows.num_rows)
        for sink in output.sinks
    ]
    steps.append(StagedDrop(root=staging_root, key=key))
    _, created = CommitSequence(seq_id, tuple(steps), max_attempts).write(store)
    if not created:
        staging.delete(key)  # a concurrent publisher's sequence stands, with its own staged rows
        return stage_batch(spark, store, staging_root, output, raw, batch, version, max_attempts)
    fault_point("commit.after_write_sequence")
    return seq_id, batch, rows.num_rows


def publication_rows(spark: SparkSession, raw: RawBatches, output: RecordOutput, batch: int, version: int) -> pa.Table:
    """The rows batch `batch` publishes to `output`: the records it inserted, read from the files of its own commit
    (version `version`), through the output's transform (on Spark; without one, no Spark is needed)."""
    rows = inserted_rows(raw.raw_path, version, batch, [*RECORD_COLUMNS, *raw.pipeline.record_schema.names])
    if output.transform is None:
        return rows
    return output.transform(spark.createDataFrame(rows)).toArrow()


def publications_of(store: CommitStore, asset: str, recent: int | None = None) -> list[tuple[str, list[RecordWrite]]]:
    """The record output's publications (sequence id, its sink writes), oldest first; the newest `recent` only."""
    prefix = f"{asset_key_part(asset)}:epoch-"
    found = sorted((s for s in store.sequences() if s.startswith(prefix)), key=batch_of)
    found = found[-recent:] if recent else found
    publications = []
    for seq in found:
        record = store.get(seq)
        if record is not None:
            writes = [RecordWrite.from_params({k: v for k, v in s.items() if k != "kind"})
                      for s in record.steps if s["kind"] == RecordWrite.kind]
            publications.append((seq, writes))  # type: ignore[arg-type]
    return publications


def batch_of(sequence_id: str) -> int:
    """The batch a record output's sequence publishes."""
    return int(sequence_id.rsplit("batch-", 1)[1])


def staged_rows(record: SequenceRecord) -> int:
    """The rows a record output's sequence publishes."""
    return next((int(s["rows"]) for s in record.steps if s["kind"] == RecordWrite.kind), 0)
