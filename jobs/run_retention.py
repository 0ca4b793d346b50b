"""The Dagster job `prune_runs` and its hourly schedule: finished micro-batch runs older than the run retention
are deleted from the instance, with their event logs.

A source makes a run every few seconds (thousands a day), and Dagster keeps every run for ever: its `retention`
setting prunes sensor and schedule ticks only. Nothing in onceflow reads an old finished run: sensors look at runs
in flight and at the newest runs of a source, and a failed run's retry is created within minutes. The prune job's
own runs go too. Runs still queued or running are never touched, whatever their age.

The raw asset's history outlives the runs: each materialization a pruned run made (a batch: its figures, its
`dagster/row_count`) is reported again, run-less, before the run is deleted, so the asset's plots and its
catalogue page keep every batch; what goes is the run's own record and logs.
"""

import time
from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg

PRUNE_JOB = "prune_runs"
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
PAGE = 500


def prune_runs(
    instance: dg.DagsterInstance, job_names: Sequence[str], older_than_s: float, now_s: float | None = None
) -> int:
    """Delete the finished runs of `job_names` last updated more than `older_than_s` before `now_s`; how many."""
    cutoff = datetime.fromtimestamp((time.time() if now_s is None else now_s) - older_than_s, UTC)
    deleted = 0
    for job_name in job_names:
        filters = dg.RunsFilter(job_name=job_name, statuses=FINISHED, updated_before=cutoff)
        while run_ids := instance.get_run_ids(filters=filters, limit=PAGE):
            for run_id in run_ids:
                keep_materializations(instance, run_id)
                instance.delete_run(run_id)
            deleted += len(run_ids)
    return deleted


def keep_materializations(instance: dg.DagsterInstance, run_id: str) -> int:
    """Report the materializations of run `run_id` again without a run (naming it and when it made each), so that
    deleting the run keeps them; how many."""
    kept, cursor = 0, None
    while True:
        page = instance.get_records_for_run(run_id, cursor=cursor, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        for record in page.records:
            event = record.event_log_entry.asset_materialization
            if event is None:
                continue
            metadata = {**event.metadata, "pruned_run_id": run_id,
                        "materialized_at_ms": int(record.event_log_entry.timestamp * 1000)}
            instance.report_runless_asset_event(dg.AssetMaterialization(
                event.asset_key, description=event.description, metadata=metadata, partition=event.partition,
                tags=event.tags))
            kept += 1
        if not page.has_more:
            return kept
        cursor = page.cursor


def build_run_retention_job(
    micro_batch_jobs: Sequence[str], retention_h: float
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The job pruning the runs of `micro_batch_jobs` (and its own), and its hourly schedule."""
    job_names = [*micro_batch_jobs, PRUNE_JOB]

    @dg.op(name="prune_micro_batch_runs")
    def prune_op(context: dg.OpExecutionContext) -> None:
        deleted = prune_runs(context.instance, job_names, retention_h * 3600)
        context.log.info(f"deleted {deleted} finished runs of {', '.join(job_names)} older than {retention_h:g} h")

    @dg.job(name=PRUNE_JOB, description="Deletes finished micro-batch runs (and this job's) older than the run "
            "retention (ONCEFLOW_RUN_RETENTION_H), so the instance's run history stays bounded.")
    def prune() -> None:
        prune_op()

    schedule = dg.ScheduleDefinition(
        name="prune_runs_hourly", job=prune, cron_schedule="41 * * * *", execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
    return prune, schedule
