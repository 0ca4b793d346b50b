"""The onceflow code location: every pipeline's jobs and assets, generated from its declaration."""

from __future__ import annotations

import dagster as dg

from assets.commits_check import build_commits_check
from assets.windows import build_window_asset
from jobs.finalize_job import finalize_commits
from jobs.ingest_job import build_ingest_job, raw_asset_key
from orchestration.commit_sensor import build_commit_sensor
from orchestration.micro_batch_sensor import build_micro_batch_sensor
from orchestration.pipelines import PIPELINES
from orchestration.resources import resources_from_env
from orchestration.window_sensor import build_window_sensor


def build_definitions() -> dg.Definitions:
    return dg.Definitions(
        assets=[
            dg.AssetSpec(
                raw_asset_key(p),
                description=f"Raw records of `{p.name}`, deduplicated on record ID: the Delta table `{p.raw_table}`.",
                group_name=p.name,
                kinds={"delta", "spark"},
            )
            for p in PIPELINES
        ]
        + [build_window_asset(p) for p in PIPELINES],
        asset_checks=[build_commits_check(p) for p in PIPELINES],
        jobs=[build_ingest_job(p) for p in PIPELINES] + [finalize_commits],
        sensors=[build_micro_batch_sensor(p) for p in PIPELINES]
        + [build_window_sensor(p) for p in PIPELINES]
        + [build_commit_sensor(PIPELINES)],
        resources=resources_from_env(),
        # One process per run: every job is one step, and a second process per step only adds start-up time.
        executor=dg.in_process_executor,
    )


defs = build_definitions()
