"""A record output as Dagster sees it: an asset downstream of its pipeline's raw asset, materialized once per
published batch by the ingest run (`onceflow.jobs.record_publisher`), and its check `sinks_hold_batches`.

Executed on its own, the check asks every sink, read-only, whether it holds each of the output's newest
publications that the commit store records as done; the ingest run reports it batch by batch.
"""

from __future__ import annotations

import dagster as dg

from onceflow.jobs.declare.bigquery_sink import BigQuerySink
from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.file_sink import FileSink
from onceflow.jobs.declare.kafka_sink import KafkaSink
from onceflow.jobs.declare.postgres_sink import PostgresSink
from onceflow.jobs.declare.record_output import RecordOutput, close_sinks
from onceflow.jobs.ingest_job import raw_asset_key
from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_sequence import publications_of
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.record_publisher import SINKS_HOLD_BATCHES
from onceflow.resources.lake import LakeResource

CHECKED_BATCHES = 20


def build_record_asset(pipeline: Pipeline, output: RecordOutput) -> dg.AssetSpec:
    kinds = {kind for sink in output.sinks for kind in _kinds(sink)}
    return dg.AssetSpec(
        dg.AssetKey(output.asset),
        deps=[raw_asset_key(pipeline)],
        description=output.description or f"Every record of `{pipeline.raw_table}`, batch by batch, "
        f"{'through a transform, ' if output.transform else ''}to {', '.join(s.name for s in output.sinks)}.",
        group_name=pipeline.name,
        kinds=set(sorted(kinds)[:3]),  # Dagster shows at most three
        metadata={"sinks": [sink.name for sink in output.sinks]},
    )


def _kinds(sink: object) -> tuple[str, ...]:
    if isinstance(sink, PostgresSink):
        return ("postgres",)
    if isinstance(sink, KafkaSink):
        return ("kafka",)
    if isinstance(sink, FileSink):
        return (sink.format,)
    if isinstance(sink, BigQuerySink):
        return ("bigquery",)
    return ()


def build_record_check(output: RecordOutput) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=dg.AssetKey(output.asset), name=SINKS_HOLD_BATCHES,
        description=f"Every sink holds each of the newest {CHECKED_BATCHES} published batches.",
    )
    def sinks_hold_batches(onceflow_lake: LakeResource) -> dg.AssetCheckResult:
        store = CommitStore(onceflow_lake.commits())
        ctx = CommitContext(store, records={output.asset: output})
        missing, checked = [], 0
        try:
            for seq, writes in publications_of(store, output.asset, CHECKED_BATCHES):
                if store.state(seq).status != DONE:
                    continue
                checked += 1
                missing += [f"{seq} in {w.sink}" for w in writes if not w.verify(ctx)]
        finally:
            close_sinks([output])
        return dg.AssetCheckResult(passed=not missing, metadata={"batches_checked": checked, "missing": missing},
                                   description=None if not missing else f"{len(missing)} publications missing")

    return sinks_hold_batches
