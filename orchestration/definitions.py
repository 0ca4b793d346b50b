"""The onceflow code location: every pipeline's jobs and assets, generated from its declaration."""

from __future__ import annotations

import dagster as dg

from assets.windows import build_window_asset
from jobs.ingest_job import build_ingest_job, raw_asset_key
from orchestration.pipelines import PIPELINES
from orchestration.resources import resources_from_env


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
        jobs=[build_ingest_job(p) for p in PIPELINES],
        resources=resources_from_env(),
    )


defs = build_definitions()
