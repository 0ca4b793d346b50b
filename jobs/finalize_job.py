"""The Dagster job `finalize_commits`: drive one commit sequence to the end; what `commit_sensor` launches.

Runs of this job are tagged with the sequence (`onceflow/commit_sequence`). A failed attempt fails the run, so
Dagster's run retries (on in `dagster.yaml`) try again as the same attempt lineage (same root run id); the commit
sensor starts a new lineage only after a lineage has finally failed.
"""

import time
from collections.abc import Mapping

import dagster as dg

from onceflow.jobs.declare.record_output import RecordOutput, close_sinks
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import run_sequence
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.record_publisher import publication_events, record_publication
from onceflow.jobs.run_worker import record_worker
from onceflow.resources.bigquery import BigQueryResource
from onceflow.resources.lake import LakeResource

FINALIZE_JOB = "finalize_commits"
SEQUENCE_TAG = "onceflow/commit_sequence"
COMMITS_POOL = "onceflow_commits"


class FinalizeConfig(dg.Config):
    sequence_id: str


def commit_context(
    lake: LakeResource, bigquery: BigQueryResource, records: Mapping[str, RecordOutput] | None = None
) -> CommitContext:
    """The runtime context of commit steps: the lake's commit store, BigQuery through the resource, and the code
    location's record outputs (by asset), whose sinks record sequences write to."""
    return CommitContext(CommitStore(lake.commits()), bigquery=lambda _project: bigquery.get_client(),
                         records=dict(records or {}))


def finalize_run_config(sequence_id: str) -> dict:
    return {"ops": {"finalize_sequence": {"config": {"sequence_id": sequence_id}}}}


def build_finalize_job(records: Mapping[str, RecordOutput]) -> dg.JobDefinition:
    """The code location's `finalize_commits` job; `records` are its record outputs, by asset."""

    @dg.op(pool=COMMITS_POOL)
    def finalize_sequence(
        context: dg.OpExecutionContext,
        config: FinalizeConfig,
        onceflow_lake: LakeResource,
        onceflow_bigquery: BigQueryResource,
    ) -> None:
        record_worker(context)
        run = context.run
        ctx = commit_context(onceflow_lake, onceflow_bigquery, records)
        began = time.monotonic()
        try:
            result = run_sequence(ctx, config.sequence_id, run.run_id, run.root_run_id or run.run_id)
        finally:
            close_sinks(records.values())
        publication = record_publication(ctx.store, records, result, (time.monotonic() - began) * 1000)
        for event in publication_events(publication) if publication else ():
            context.log_event(event)
        context.log.info(
            f"commit sequence {result.sequence_id}: {result.outcome} (attempt {result.attempt}; executed steps "
            f"{list(result.executed)}, found in effect {list(result.verified)})"
        )
        result.raise_on_failure()

    @dg.job(name=FINALIZE_JOB, description="Verify and redo the steps of one commit sequence until all are done.")
    def finalize_commits() -> None:
        finalize_sequence()

    return finalize_commits
