"""Where a batch's time goes, by stage (`onceflow.jobs.ingest.stage_times`): each ingest mode's median over every
batch of its timed runs of a data set, from the figures each batch's `IngestResult` carries."""

from __future__ import annotations

import statistics
from typing import Any

from onceflow.jobs.ingest.stage_times import STAGES


def stage_medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """By onceflow mode: how many batches, and the median milliseconds of each stage among the batches that ran
    it (stages a mode never runs are left out)."""
    by_mode: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        if run.get("round", 0) >= 1 and "stage_ms" in run:
            by_mode.setdefault(run["contender"], []).extend(run["stage_ms"])
    return {mode: {"batches": len(batches), "median_ms": batch_medians(batches)} for mode, batches in by_mode.items()}


def batch_medians(batches: list[dict[str, float]]) -> dict[str, float]:
    """Each stage's median milliseconds among `batches` (their `IngestResult.times.ms`) that ran it."""
    ran = {stage: [b[stage] for b in batches if stage in b] for stage in STAGES}
    return {stage: round(statistics.median(ms), 1) for stage, ms in ran.items() if ms}


def stage_lines(medians: dict[str, dict[str, Any]]) -> list[str]:
    """Printed: one line per mode."""
    return [f"{mode} batch, median ms over {row['batches']}: {stage_text(row['median_ms'])}"
            for mode, row in medians.items()]


def stage_text(median_ms: dict[str, float]) -> str:
    """`batch_medians`' figures as one printed phrase."""
    return ", ".join(f"{stage} {ms:,.0f}" for stage, ms in median_ms.items())
