"""The Dagster job `ingest_<pipeline>`: land + ingest micro-batches of the pipeline's source.

Dagster runs are at-least-once; the exactly-once boundary is the Delta commit inside `run_micro_batch`. Each
batch is recorded as a materialization of the `raw_<pipeline>` asset, so Dagster plots the counts over time.

A run takes one batch, then, for `run_s` seconds (`ONCEFLOW_MICRO_BATCH_RUN_S`, 0 by default), keeps polling the
source and taking the next batch as soon as there is one: a warm process with its Spark session commits a batch
in seconds, where a new run first spends seconds starting. Runs of a source take turns (`run_relay`), so one batch
is in flight at a time, and a worker run hands over to the next one without a gap. Each batch is its own
materialization with `requested_at_ms`, `requested_by` (`launch`: the run's creation, for its first batch;
`handover`: the moment the run it took over from stopped taking batches; `poll`: the run's own poll) and
`committed_at_ms`.
"""

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.delta.transactions import warm_writer
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.raw_checks import dead_letter_evaluation
from onceflow.jobs.record_publisher import Publication, RecordPublisher, publication_events
from onceflow.jobs.run_relay import Turn, keep_going, plan_end, release, take_turn
from onceflow.jobs.run_worker import START_TIMEOUT_S, record_worker
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.jobs.table_metadata import RowCounts
from onceflow.resources.faults import fault_point
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource
from onceflow.resources.spark import SparkResource
from onceflow.resources.spark_functions import register_spark_functions


def raw_asset_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey(f"raw_{pipeline.name}")


def source_tag(pipeline: Pipeline) -> dict[str, str]:
    """The tag on every micro-batch run of the pipeline's source."""
    return {"onceflow/source": pipeline.source_id}


def ingest_metadata(result: IngestResult) -> dict[str, Any]:
    """A batch's figures as its materialization records them. An attempt whose batch another attempt committed and
    recorded (it lost the commit race, or replayed a batch already recorded) counts nothing: that attempt's
    materialization counts the batch (Dagster sums and plots these), once."""
    counted = result.counted and not result.lost_race
    metadata: dict[str, Any] = {
        "batch_id": result.batch_id,
        "records_read": result.received if counted else 0,
        "inserted": result.inserted if counted else 0,
        "duplicates_in_batch": result.duplicates_in_batch if counted else 0,
        "duplicates_already_committed": result.duplicates_committed if counted else 0,
        "replayed_batch_noop": result.replayed,
        "lost_commit_race": result.lost_race,
        "read_ahead": result.read_ahead,
        "dead_lettered": result.dead_lettered_new if counted else 0,
        "dead_letter_duplicates": result.dead_letter_duplicates if counted else 0,
        "delta_version": result.raw_version,
    }
    if result.realigned_from is not None:
        metadata["checkpoint_was_behind_lake_at_batch"] = result.realigned_from
    for reason, count in sorted(result.dead_lettered.items() if counted else ()):
        metadata[f"dead_lettered_{reason}"] = count
    if result.max_event_time_ms is not None:
        metadata["max_event_time_ms"] = result.max_event_time_ms
    for name, value in (result.fast_path or {}).items():
        metadata[f"fast_path_{name}"] = value
    for stage, ms in result.times.ms.items():  # where its time went (`onceflow.jobs.ingest.stage_times`)
        metadata[f"{stage}_ms"] = round(ms, 1)
    return metadata


POLL_S = 1.0
RELAY_ASK_S = 1.0


def build_ingest_job(
    pipeline: Pipeline, run_s: float = 0.0, start_timeout_s: float = START_TIMEOUT_S
) -> dg.JobDefinition:
    """The micro-batch job of a pipeline, named `ingest_<name>`; its runs take batches for `run_s` seconds, and
    do not wait on an earlier run that has not begun its work within `start_timeout_s` (`run_worker.never_began`)."""
    raw_key = raw_asset_key(pipeline)

    # No Dagster pool: turns (`run_relay`) keep one batch of the source in flight, and let the next run's process
    # start while the current one still takes batches.
    @dg.op(name=f"micro_batch_{pipeline.name}")
    def micro_batch(
        context: dg.OpExecutionContext,
        onceflow_spark: SparkResource,
        onceflow_lake: LakeResource,
        onceflow_pubsub: PubSubResource,
    ) -> None:
        fault_point("run.before_work")
        record_worker(context)
        source, tags = open_source(pipeline, onceflow_lake, onceflow_pubsub.client), source_tag(pipeline)
        # A classic session lives as long as the run's process: built once, not again for every batch.
        # A Connect engine may restart under a run: asked for each batch, the session starts anew on the new one.
        spark = onceflow_spark
        get_spark = spark.get_session if spark.remote else functools.cache(spark.get_session)
        turn = take_turn(context.instance, context.run_id, tags, warm=lambda: warm_up(get_spark, source),
                         start_timeout_s=start_timeout_s, say=context.log.info)
        first_request = _first_request(context, turn)
        until_ms = plan_end(context.instance, context.run_id, run_s) if run_s else None
        publisher = (RecordPublisher(source, onceflow_lake, (context.run_id, context.run.root_run_id or context.run_id))
                     if pipeline.record_outputs else None)
        try:
            if publisher is not None:
                _log_publications(context, publisher.catch_up(get_spark))
            committed = _take_batches(context, raw_key, get_spark, source, (until_ms, start_timeout_s), first_request,
                                      publisher)
        finally:
            if publisher is not None:
                publisher.close()
        source.read_ahead.drop()  # the next run reads that batch itself: nothing of this run's Spark work outlives it
        release(context.instance, context.run_id)
        if not committed:
            context.log.info(f"{pipeline.source_id}: no new data")

    @dg.job(
        name=f"ingest_{pipeline.name}",
        description=f"Land + ingest micro-batches of `{pipeline.source_id}` into `{pipeline.raw_table}`.",
        tags=source_tag(pipeline),
    )
    def ingest() -> None:
        micro_batch()

    return ingest


def _take_batches(
    context: dg.OpExecutionContext, raw_key: dg.AssetKey, get_spark: Callable[[], SparkSession],
    source: SourceRuntime, until: tuple[int | None, float], first_request: tuple[int, str],
    publisher: RecordPublisher | None = None,
) -> int:
    """Take the source's next batch, then, for a worker run (`until`: its planned end, and the start timeout of the
    runs it hands over to), the next ones while `keep_going` says so; how many batches committed.

    A batch's log line and materialization are written to the instance (a write to its storage each) on a thread
    of their own, in order, while the next batch runs, and its publication to the record outputs (`publisher`)
    follows them there. Before its planned end, a run asks whether another run waits for it about once a second,
    not once a batch: each ask reads the source's runs from the instance.
    """
    tags, (requested_ms, requested_by), (until_ms, start_timeout_s) = source_tag(source.pipeline), first_request, until
    committed, asked_ms = 0, _now_ms()
    rows = RowCounts(source.raw_path)
    with ThreadPoolExecutor(1, thread_name_prefix="onceflow-report") as reports:
        reported: Future | None = None
        while True:
            result = run_micro_batch(get_spark, source)
            if result is not None:
                metadata = _metadata(source, result, requested_ms, requested_by)
                if reported is not None:
                    reported.result()
                reported = reports.submit(_report, context, raw_key, source, result, metadata, rows,
                                          (publisher, get_spark))
                committed += 1
            if until_ms is None:
                break
            now = _now_ms()
            if now >= until_ms or now - asked_ms >= RELAY_ASK_S * 1000:
                if not keep_going(context.instance, context.run_id, tags, until_ms, start_timeout_s):
                    break
                asked_ms = now
            if result is None:
                time.sleep(POLL_S)
            requested_ms, requested_by = _now_ms(), "poll"
        if reported is not None:
            reported.result()
    return committed


def _now_ms() -> int:
    return int(time.time() * 1000)


def _first_request(context: dg.OpExecutionContext, turn: Turn) -> tuple[int, str]:
    """When the run's first batch was asked for, and by what: when the run it took over from stopped taking
    batches ("handover"), else the run's creation (the sensor's request, a launch: "launch")."""
    if turn.since_ms is not None:
        return turn.since_ms, "handover"
    record = context.instance.get_run_record_by_id(context.run_id)
    return (int(record.create_timestamp.timestamp() * 1000) if record else _now_ms()), "launch"


def warm_up(get_spark: Callable[[], SparkSession], source: SourceRuntime) -> None:
    """Start the run's Spark session, onceflow's functions in it and Delta's writer of the raw table, while an
    earlier run still takes batches."""
    spark = get_spark()
    register_spark_functions(spark)
    warm_writer(spark, source.raw_path)


def _metadata(source: SourceRuntime, result: IngestResult, requested_ms: int, requested_by: str) -> dict[str, Any]:
    """A committed batch's materialization metadata, once it is checked to balance."""
    if not result.balances():
        raise RuntimeError(f"batch {result.batch_id} does not balance: {result}")
    metadata = {**ingest_metadata(result), "requested_at_ms": requested_ms, "requested_by": requested_by,
                "committed_at_ms": _now_ms()}
    plan = source.plans.plan_of(result.batch_id)
    if plan is not None:
        metadata.update({f"lag_{stream}": count for stream, count in source.reader.lag(plan).items()})
    return metadata


def _report(
    context: dg.OpExecutionContext, raw_key: dg.AssetKey, source: SourceRuntime, result: IngestResult,
    metadata: dict[str, Any], rows: RowCounts,
    records: tuple[RecordPublisher | None, Callable[[], SparkSession]],
) -> None:
    """Say what a committed batch did and record it as a materialization, with the table's rows now and then
    (Dagster's `dagster/row_count`, read from the log here, beside the next batch); then publish it to the record
    outputs (`records`: their publisher and the run's sessions)."""
    count = rows.at(result.raw_version)
    if count is not None:
        metadata = {**metadata, "dagster/row_count": count}
    context.log.info(
        f"{source.pipeline.source_id} batch {result.batch_id}: read {result.received}, inserted {result.inserted}, "
        f"duplicates {result.duplicates}, dead-lettered {result.dead_lettered_new}; {result.times}"
        + (" (replayed batch: already committed, nothing written)" if result.replayed else "")
    )
    context.log_event(dg.AssetMaterialization(asset_key=raw_key, metadata=metadata))
    check = dead_letter_evaluation(source.pipeline, raw_key, metadata["dead_lettered"], metadata["records_read"],
                                   f"batch {result.batch_id}")
    if check is not None:
        context.log_event(check)
    publisher, get_spark = records
    if publisher is not None:
        _log_publications(context, publisher.publish(get_spark, result.batch_id, result.raw_version))


def _log_publications(context: dg.OpExecutionContext, publications: list[Publication]) -> None:
    for publication in publications:
        context.log.info(f"{publication.output.asset} batch {publication.batch}: {publication.rows} rows, "
                         f"{publication.result.outcome} in {publication.ms:.0f} ms"
                         + (f" ({publication.result.error})" if publication.result.error else ""))
        for event in publication_events(publication):
            context.log_event(event)
