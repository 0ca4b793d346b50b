"""The Dagster job `ingest_<pipeline>`: one land + ingest micro-batch of the pipeline's source.

Dagster runs are at-least-once; the exactly-once boundary is the Delta commit inside `run_micro_batch`. Each
batch is recorded as a materialization of the `raw_<pipeline>` asset, so Dagster plots the counts over time.
"""

from typing import Any

import dagster as dg

from jobs.declaration import Pipeline
from jobs.ingest import IngestResult
from jobs.micro_batch import run_micro_batch
from jobs.run_worker import record_worker
from jobs.source_reader import open_source
from resources.lake import LakeResource
from resources.pubsub import PubSubResource
from resources.spark import SparkResource


def raw_asset_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey(f"raw_{pipeline.name}")


def source_tag(pipeline: Pipeline) -> dict[str, str]:
    """The tag on every micro-batch run of the pipeline's source."""
    return {"onceflow/source": pipeline.source_id}


def source_pool(pipeline: Pipeline) -> str:
    """One micro-batch of a source in flight at a time: batches commit in order."""
    return f"onceflow_source_{pipeline.name}"


def ingest_metadata(result: IngestResult) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "batch_id": result.batch_id,
        "records_read": result.received,
        "inserted": result.inserted,
        "duplicates_in_batch": result.duplicates_in_batch,
        "duplicates_already_committed": result.duplicates_committed,
        "replayed_batch_noop": result.replayed,
        "lost_commit_race": result.lost_race,
        "dead_lettered": result.dead_lettered_new,
        "dead_letter_duplicates": result.dead_letter_duplicates,
        "delta_version": result.raw_version,
    }
    if result.realigned_from is not None:
        metadata["checkpoint_was_behind_lake_at_batch"] = result.realigned_from
    for reason, count in sorted(result.dead_lettered.items()):
        metadata[f"dead_lettered_{reason}"] = count
    if result.max_event_time_ms is not None:
        metadata["max_event_time_ms"] = result.max_event_time_ms
    return metadata


def build_ingest_job(pipeline: Pipeline) -> dg.JobDefinition:
    """The micro-batch job of a pipeline, named `ingest_<name>`."""
    raw_key = raw_asset_key(pipeline)

    @dg.op(name=f"micro_batch_{pipeline.name}", pool=source_pool(pipeline))
    def micro_batch(
        context: dg.OpExecutionContext, spark: SparkResource, lake: LakeResource, pubsub: PubSubResource
    ) -> None:
        record_worker(context)
        result = run_micro_batch(spark.get_session, open_source(pipeline, lake, pubsub.client))
        if result is None:
            context.log.info(f"{pipeline.source_id}: no new data")
            return
        if not result.balances():
            raise RuntimeError(f"batch {result.batch_id} does not balance: {result}")
        context.log.info(
            f"{pipeline.source_id} batch {result.batch_id}: read {result.received}, inserted {result.inserted}, "
            f"duplicates {result.duplicates}, dead-lettered {result.dead_lettered_new}"
            + (" (replayed batch: already committed, nothing written)" if result.replayed else "")
        )
        context.log_event(dg.AssetMaterialization(asset_key=raw_key, metadata=ingest_metadata(result)))

    @dg.job(
        name=f"ingest_{pipeline.name}",
        description=f"One land + ingest micro-batch of `{pipeline.source_id}` into `{pipeline.raw_table}`.",
        tags=source_tag(pipeline),
    )
    def ingest() -> None:
        micro_batch()

    return ingest
