"""The raw asset's checks: `dead_letter_rate` (`onceflow.jobs.raw_checks`) run on its own judges the pipeline's
totals so far, read from its checkpoint; the ingest job reports it batch by batch."""

from __future__ import annotations

import dagster as dg

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.ingest_job import raw_asset_key
from onceflow.jobs.raw_checks import DEAD_LETTER_RATE, dead_letter_evaluation
from onceflow.jobs.sources.reader import open_source
from onceflow.resources.lake import LakeResource


def build_raw_checks(pipeline: Pipeline) -> list[dg.AssetChecksDefinition]:
    """The raw asset's checks the declaration asks for (none without `max_dead_letter_rate`)."""
    if pipeline.max_dead_letter_rate is None:
        return []
    key = raw_asset_key(pipeline)

    @dg.asset_check(
        asset=key, name=DEAD_LETTER_RATE,
        description=f"At most {pipeline.max_dead_letter_rate:.2%} of a batch's records are dead letters.",
    )
    def dead_letter_rate(onceflow_lake: LakeResource) -> dg.AssetCheckResult:
        totals = open_source(pipeline, onceflow_lake).checkpoints.load().totals
        evaluation = dead_letter_evaluation(pipeline, key, totals.get("dead_lettered", 0), totals.get("received", 0),
                                            "the totals so far")
        if evaluation is None:
            return dg.AssetCheckResult(passed=True, metadata={"received": 0})
        return dg.AssetCheckResult(passed=evaluation.passed, severity=evaluation.severity,
                                   metadata=evaluation.metadata, description=evaluation.description)

    return [dead_letter_rate]
