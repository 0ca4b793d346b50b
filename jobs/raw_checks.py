"""The raw asset's check `dead_letter_rate`, for a pipeline that declares `max_dead_letter_rate`: fails when more
of a batch's records were dead letters than that. The ingest job reports it with each batch it commits (a
failure is an ERROR evaluation for alerts; the batch is committed and its dead letters kept either way), and
the check run on its own (`onceflow.assets.raw_checks`) judges the pipeline's totals so far."""

from __future__ import annotations

import dagster as dg

from onceflow.jobs.declare.declaration import Pipeline

DEAD_LETTER_RATE = "dead_letter_rate"


def dead_letter_evaluation(
    pipeline: Pipeline, asset_key: dg.AssetKey, dead_lettered: int, received: int, of: str
) -> dg.AssetCheckEvaluation | None:
    """The check's verdict on `dead_lettered` of `received` records (`of` says which: a batch, the totals); None
    when the pipeline declares no limit, or nothing was received."""
    limit = pipeline.max_dead_letter_rate
    if limit is None or received <= 0:
        return None
    rate = dead_lettered / received
    return dg.AssetCheckEvaluation(
        asset_key=asset_key,
        check_name=DEAD_LETTER_RATE,
        passed=rate <= limit,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"of": of, "dead_lettered": dead_lettered, "received": received, "rate": round(rate, 6),
                  "max_dead_letter_rate": limit},
        description=None if rate <= limit else (
            f"{dead_lettered} of {received} records ({rate:.2%}) were dead letters, above {limit:.2%}: see "
            f"`dead_letter/{pipeline.name}` for their reasons"),
    )
