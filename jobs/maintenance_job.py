"""The Dagster job `maintain_tables` and its daily schedule: `onceflow.jobs.delta.maintenance.maintain` for every pipeline.

It needs no pool of its own: compaction touches only raw buckets below the dedup horizon (which ingest no longer
writes), window tables (whose MERGE merges again when it loses a race) and dead-letter tables (whose appends are
decided again when they lose one), and vacuum keeps every version within the retention, so it runs beside
micro-batches and windows.

It then audits each exactly-once pipeline's raw table for record IDs held twice within the dedup horizon, the
whole horizon, which a window run's `no_duplicate_record_ids` check leaves to it (that check looks at the time
buckets of the run's windows only); any found fail the run, naming the pipelines, after every table was maintained.
"""

import dagster as dg

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.delta.maintenance import maintain
from onceflow.jobs.ingest.micro_batch import horizon_floor_ms
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.checks import DuplicateRecordIds, duplicate_record_ids
from onceflow.resources.lake import LakeResource
from onceflow.resources.spark import SparkResource

MAINTENANCE_JOB = "maintain_tables"


def build_maintenance_job(pipelines: list[Pipeline]) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    @dg.op(name="maintain_pipeline_tables")
    def maintain_tables_op(
        context: dg.OpExecutionContext, onceflow_spark: SparkResource, onceflow_lake: LakeResource
    ) -> None:
        session = onceflow_spark.get_session()
        duplicates: dict[str, int] = {}
        for pipeline in pipelines:
            source = open_source(pipeline, onceflow_lake)
            checkpoint = source.checkpoints.load()
            floor = horizon_floor_ms(pipeline.delivery, pipeline.dedup_horizon_s, checkpoint)
            tables = {"raw": source.raw_path, "dead_letter": source.dead_letter_path}
            tables |= {o.asset: onceflow_lake.table_path(o.table) for o in pipeline.windowed_outputs}
            reports = maintain(session, pipeline, tables, floor)
            if pipeline.delivery == "exactly_once" and any(r.table == "raw" for r in reports):
                duplicates[pipeline.name] = duplicate_record_ids(
                    session, source.raw_path, pipeline.dedup_horizon_s, source_watermark_ms(checkpoint))
                context.log.info(f"{pipeline.name} raw: {duplicates[pipeline.name]} record IDs held twice within "
                                 f"the dedup horizon")
            for report in reports:
                compacted = (f", compacted time buckets below {report.compacted_below_bucket}"
                             if report.compacted_below_bucket is not None else ", compacted" if report.compacted_whole
                             else "")
                staging = (f", removed {report.staging_logs_removed} abandoned staging logs"
                           if report.staging_logs_removed else "")
                context.log.info(
                    f"{pipeline.name} {report.table}: retention {pipeline.retention}, vacuumed{compacted}{staging}"
                )
        found = {name: n for name, n in duplicates.items() if n}
        if found:
            raise DuplicateRecordIds(
                "record IDs held twice within the dedup horizon of exactly-once raw tables: "
                + ", ".join(f"{name}: {n}" for name, n in found.items())
                + " (`onceflow verify` names them)"
            )

    @dg.job(name=MAINTENANCE_JOB, description="Retention, compaction outside the dedup horizon and of window "
            "and dead-letter tables, vacuum within retention, for every pipeline's tables, then an audit of raw for record IDs held "
            "twice within the horizon; never breaks exactly-once or a backfill within retention.")
    def maintain_tables() -> None:
        maintain_tables_op()

    schedule = dg.ScheduleDefinition(
        name="maintain_tables_daily", job=maintain_tables, cron_schedule="17 3 * * *", execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
    return maintain_tables, schedule
