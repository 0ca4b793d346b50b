"""The onceflow code location: every pipeline's job, assets, checks and sensors, generated from its declaration.

The pipelines are `ONCEFLOW_PIPELINES`'s (or the built-ins); settings and declarations are validated here, when
the code location loads, so a mistake fails the load with a message naming the pipeline and field (or variable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

import dagster as dg

from onceflow.assets.commits_check import build_commits_check
from onceflow.assets.raw_checks import build_raw_checks
from onceflow.assets.record_asset import build_record_asset, build_record_check
from onceflow.assets.window_asset import build_window_asset
from onceflow.jobs.declare.declaration import DeclarationError, Pipeline, WindowedOutput
from onceflow.jobs.declare.durations import parse_duration
from onceflow.jobs.delta.raw_table import raw_schema
from onceflow.jobs.finalize_job import build_finalize_job
from onceflow.jobs.ingest_job import build_ingest_job, raw_asset_key
from onceflow.jobs.maintenance_job import build_maintenance_job
from onceflow.jobs.record_publisher import record_outputs_of
from onceflow.jobs.run_retention import build_run_retention_job
from onceflow.jobs.table_metadata import table_definition_metadata
from onceflow.orchestration.deployments import LAKE, SPARK, resources_for
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.pipelines.table_check import check_raw_tables
from onceflow.orchestration.pipelines.transform_check import check_transforms
from onceflow.orchestration.sensors.commit import build_commit_sensor
from onceflow.orchestration.sensors.micro_batch import build_micro_batch_sensor
from onceflow.orchestration.sensors.runs import build_dead_run_sensor
from onceflow.orchestration.sensors.window import build_window_sensor
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import Settings, load_settings


def raw_asset(pipeline: Pipeline, lake: LakeResource) -> dg.AssetSpec:
    return dg.AssetSpec(
        raw_asset_key(pipeline),
        description=f"Raw records of `{pipeline.name}`, deduplicated on record ID: the Delta table "
        f"`{pipeline.raw_table}` (dead letters in `{pipeline.dead_letter_table}`).",
        group_name=pipeline.name,
        kinds={"delta", "spark"},
        metadata=table_definition_metadata(lake.table_path(pipeline.raw_table), pipeline.raw_table,
                                           raw_schema(pipeline)),
    )


# A closing window still waits for the window sensor's tick, the run queue and the run itself.
RUN_SLACK = timedelta(minutes=5)


def window_freshness(pipeline: Pipeline, output: WindowedOutput) -> dg.FreshnessPolicy:
    """Fails when the window asset was last materialized longer ago than one window, its allowed lateness, the
    watermark's band and idle time (a window closes once the watermark, which trails the newest event by the
    band and moves on an idle source only after the idle time, passes its end plus the lateness) and `RUN_SLACK`.
    """
    band, idle = pipeline.watermark_band, pipeline.watermark_idle
    if band is None or idle is None:
        raise DeclarationError(f"pipeline {pipeline.name!r}: not resolved against the settings (load_pipelines)")
    watermark_s = parse_duration(band) + parse_duration(idle)
    lag = timedelta(seconds=output.window_s + output.allowed_lateness_s + watermark_s)
    return dg.FreshnessPolicy.time_window(fail_window=lag + RUN_SLACK)


def definitions(
    pipelines: Sequence[Pipeline] | None = None,
    settings: Settings | None = None,
    resources: Mapping[str, dg.ConfigurableResource] | None = None,
) -> dg.Definitions:
    """A code location running `pipelines` (default: `ONCEFLOW_PIPELINES`'s, else the built-ins), with every
    job, asset, check, sensor and schedule onceflow derives from them. Declarations and settings are checked
    here: a mistake raises, naming what is wrong.

    `resources` are onceflow's resources as the project configures them, under onceflow's keys
    (`onceflow_lake=LakeResource(home=dg.EnvVar("LAKE_HOME"))`, `onceflow_spark`, `onceflow_pubsub`,
    `onceflow_bigquery`); a key left out gets the resource `settings`' deployment builds (the `ONCEFLOW_*`
    variables). `onceflow.definitions([orders])` in a project's own definitions module; merge it with the
    project's other definitions with `dg.Definitions.merge`.
    """
    settings = settings or load_settings()
    pipelines = load_pipelines(settings, pipelines)
    resources = resources_for(settings, resources)
    # What the load itself reads, with any `dg.EnvVar` of the resources read now (runs read them again).
    lake: LakeResource = resources[LAKE].process_config_and_initialize()
    check_raw_tables(pipelines, lake)
    check_transforms(pipelines, resources[SPARK].process_config_and_initialize().get_session, lake.declarations())
    outputs = [(p, o) for p in pipelines for o in p.windowed_outputs]
    records = [(p, o) for p in pipelines for o in p.record_outputs]
    published = [o.asset for _, o in outputs] + [o.asset for _, o in records]
    maintenance, maintenance_schedule = build_maintenance_job(pipelines)
    timeout = settings.run_start_timeout_s
    ingest_jobs = [build_ingest_job(p, settings.micro_batch_run_s, timeout) for p in pipelines]
    prune, prune_schedule = build_run_retention_job([job.name for job in ingest_jobs], settings.run_retention_h)
    return dg.Definitions(
        assets=[raw_asset(p, lake) for p in pipelines]
        + [build_window_asset(p, o, window_freshness(p, o)) for p, o in outputs]
        + [build_record_asset(p, o) for p, o in records],
        asset_checks=[build_commits_check(asset) for asset in published]
        + [check for p in pipelines for check in build_raw_checks(p)]
        + [build_record_check(o) for _, o in records],
        jobs=[*ingest_jobs, build_finalize_job(record_outputs_of(pipelines)), maintenance, prune],
        schedules=[maintenance_schedule, prune_schedule],
        sensors=[build_micro_batch_sensor(p, settings.idle_tick_s, settings.micro_batch_run_s, settings.keep_warm_s,
                                          timeout) for p in pipelines]
        + [build_window_sensor(p, o, timeout) for p, o in outputs]
        + [build_commit_sensor(published, timeout), build_dead_run_sensor(timeout)],
        resources=resources,
        # One process per run: every job is one step, and a second process per step only adds start-up time.
        executor=dg.in_process_executor,
    )


@dg.definitions
def defs() -> dg.Definitions:
    """What `dagster` loads (`-m onceflow.orchestration.definitions`); built on load, not on import."""
    return definitions()
