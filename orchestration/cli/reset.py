"""`onceflow reset <pipeline>`: start a new epoch of a pipeline's source, deliberately.

The new epoch has its own app id (`<pipeline>/<kind>@<epoch>`) and its checkpoint starts empty but for the old
epoch's watermark (a file source takes every file again, within the dedup horizon; a Pub/Sub source reads on from
its subscription; a Kafka source goes on where the old epoch ended, on the same log). The tables stay: records the raw table
holds are still deduplicated against. A batch landed but not committed would be lost with its epoch, so reset
refuses while one waits, unless told otherwise; and it refuses while a micro-batch run of the source is queued
or running in the Dagster instance of `$DAGSTER_HOME` (that run's commits and the new epoch's would race).

Batch numbers go on across epochs, so that a raw row's `batch_id` orders it against any window's close (late
records, refired panes, the window sensor's cursor, `onceflow verify`). Reset first seals the old epoch at its next
batch (no run of it can plan that batch or any later one), then starts the new epoch at that number: every batch
the old epoch can still commit is below it. A batch dropped with `--drop-uncommitted` is fenced in the tables
(its SetTransaction committed empty), so a stale run of it commits nothing after the new epoch has begun.
"""

from __future__ import annotations

import argparse
import json

import dagster as dg
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.delta.arrow_append import post_commit_hooks
from onceflow.jobs.ingest.micro_batch import lake_batch
from onceflow.jobs.sources.checkpoint import CheckpointStore, EpochStore, SourceCheckpoint
from onceflow.jobs.sources.reader import SourceRuntime, app_id, open_source
from onceflow.orchestration.deployments import LAKE, resources_for
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.sensors.runs import in_flight
from onceflow.resources.delta_storage import delta_table
from onceflow.resources.settings import load_settings

RUNS_LOOKED_AT = 20


def cmd_reset(args: argparse.Namespace) -> int:
    settings = load_settings()
    lake = resources_for(settings)[LAKE]
    pipeline = next((p for p in load_pipelines(settings) if p.name == args.pipeline), None)
    if pipeline is None:
        print(f"onceflow reset: no pipeline {args.pipeline!r}")
        return 1
    busy = _run_in_flight(pipeline)
    if busy is not None:
        print(f"onceflow reset: a micro-batch run of {pipeline.name} is in flight ({busy}); wait for it to end "
              f"(or stop it), and switch its sensor off first if the next must not start")
        return 1
    source = open_source(pipeline, lake)
    first = max(source.checkpoints.load().committed_batch, lake_batch(source)) + 1
    while not source.checkpoints.seal(first):
        if not args.drop_uncommitted:
            print(
                f"onceflow reset: {source.app_id} batch {first} is planned but not committed; run one more "
                "micro-batch first (or pass --drop-uncommitted to give up what it holds)"
            )
            return 1
        first += 1
    fence(source, first - 1)
    epochs = EpochStore(lake.epochs())
    carry_watermark(source, CheckpointStore(lake.checkpoints(), app_id(pipeline, epochs.current(pipeline.name) + 1),
                                            first))
    epoch = epochs.advance(pipeline.name, first)
    print(f"{pipeline.name}: epoch {epoch} started; its source now commits as {app_id(pipeline, epoch)}, "
          f"from batch {first}")
    return 0


def _run_in_flight(pipeline: Pipeline) -> str | None:
    """Why a run of the pipeline's micro-batch job is in flight in the Dagster instance of `$DAGSTER_HOME`."""
    if load_settings().dagster_home is None:  # `DAGSTER_HOME`: where `DagsterInstance.get` looks
        print("onceflow reset: DAGSTER_HOME is not set, so no Dagster instance was asked for runs in flight")
        return None
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=f"ingest_{pipeline.name}"), limit=RUNS_LOOKED_AT)
        return in_flight(instance, list(runs), load_settings().run_start_timeout_s)


def carry_watermark(source: SourceRuntime, new_epoch: CheckpointStore) -> None:
    """Start the new epoch's checkpoint at the old epoch's watermark: it is the same source, its closed windows stay
    closed, and its first batch has a dedup horizon floor (without one, the ID filters of the whole raw table are
    rebuilt for it)."""
    carried = {k: v for k, v in source.checkpoints.load().watermark.items() if k in ("kind", "watermark_ms")}
    if carried.get("watermark_ms") is None:
        return

    def seeded(checkpoint: SourceCheckpoint) -> SourceCheckpoint:
        checkpoint.watermark = {**carried, **checkpoint.watermark}
        return checkpoint

    new_epoch.update(seeded)


def fence(source: SourceRuntime, batch: int) -> None:
    """Commit the SetTransaction `(app id, batch)` with no rows to the raw and dead-letter tables where they hold
    an older one: a stale attempt at a dropped batch then finds it committed (or loses the commit race) and
    writes nothing."""
    for path in (source.raw_path, source.dead_letter_path):
        try:
            table = delta_table(path)
        except TableNotFoundError:
            continue  # no commit yet: the table is created by the new epoch, after the seal
        if (table.transaction_version(source.app_id) or 0) >= batch:
            continue
        metadata = {"onceflow_source": source.app_id, "onceflow_batch": batch, "onceflow_dropped_by_reset": True}
        table.create_write_transaction(
            [], "append", table.schema(), partition_by=table.metadata().partition_columns,
            commit_properties=CommitProperties(custom_metadata={"userMetadata": json.dumps(metadata, sort_keys=True)},
                                               app_transactions=[Transaction(source.app_id, batch)]),
            post_commithook_properties=post_commit_hooks(table),
        )


def add_commands(sub: argparse._SubParsersAction) -> None:
    reset = sub.add_parser("reset", help="start a new epoch of a pipeline's source (fresh checkpoint, new app id)")
    reset.add_argument("pipeline")
    reset.add_argument("--drop-uncommitted", action="store_true", help="reset even with a batch landed, uncommitted")
    reset.set_defaults(func=cmd_reset)
