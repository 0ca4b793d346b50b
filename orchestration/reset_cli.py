"""`onceflow reset <pipeline>`: start a new epoch of a pipeline's source, deliberately.

The new epoch has its own app id (`<pipeline>/<kind>@<epoch>`), so its batch numbers start at 1 again without
ever reusing a number Delta has committed; its checkpoint starts empty (a file source takes every file again, a
Pub/Sub source reads on from its subscription). The tables stay: records the raw table holds are still
deduplicated against. A batch landed but not committed would be lost with its epoch, so reset refuses while one
waits, unless told otherwise; and it refuses while a micro-batch run of the source is queued or running in the
Dagster instance of `$DAGSTER_HOME` (that run's commits and the new epoch's would race each other).
"""

from __future__ import annotations

import argparse

import dagster as dg
from dagster._core.errors import DagsterHomeNotSetError

from jobs.declaration import Pipeline
from jobs.source_reader import app_id, open_source
from orchestration.pipelines import load_pipelines
from orchestration.resources import resources_for
from orchestration.runs import in_flight
from resources.checkpoint import EpochStore
from resources.settings import load_settings

RUNS_LOOKED_AT = 20


def cmd_reset(args: argparse.Namespace) -> int:
    settings = load_settings()
    lake = resources_for(settings)["lake"]
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
    waiting = source.checkpoints.get_plan(source.checkpoints.load().next_batch)
    if waiting is not None and not args.drop_uncommitted:
        print(
            f"onceflow reset: {source.app_id} batch {waiting.batch_id} is planned but not committed; run one more "
            "micro-batch first (or pass --drop-uncommitted to give up what it holds)"
        )
        return 1
    epoch = EpochStore(lake.epochs()).advance(pipeline.name)
    print(f"{pipeline.name}: epoch {epoch} started; its source now commits as {app_id(pipeline, epoch)}, from batch 1")
    return 0


def _run_in_flight(pipeline: Pipeline) -> str | None:
    """Why a run of the pipeline's micro-batch job is in flight in the Dagster instance of `$DAGSTER_HOME`."""
    try:
        instance = dg.DagsterInstance.get()
    except DagsterHomeNotSetError:
        print("onceflow reset: DAGSTER_HOME is not set, so no Dagster instance was asked for runs in flight")
        return None
    with instance:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=f"ingest_{pipeline.name}"), limit=RUNS_LOOKED_AT)
        return in_flight(instance, list(runs))


def add_commands(sub: argparse._SubParsersAction) -> None:
    reset = sub.add_parser("reset", help="start a new epoch of a pipeline's source (fresh checkpoint, new app id)")
    reset.add_argument("pipeline")
    reset.add_argument("--drop-uncommitted", action="store_true", help="reset even with a batch landed, uncommitted")
    reset.set_defaults(func=cmd_reset)
