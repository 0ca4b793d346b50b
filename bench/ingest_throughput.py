"""Exactly-once vs at-least-once ingest throughput on the same data (DESIGN.md section 10, benchmark 1).

A data set (`bench.datasets`) is written once as JSON-lines files; each run drains that file source with
`run_micro_batch` into a fresh onceflow home, on one shared Spark session. Only the drain is
timed (not file generation, not session start). `bench.run` runs the rounds, beside the other contenders.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
from pyspark.sql import SparkSession

from bench.datasets import BenchmarkError, Source
from bench.memory import PeakRss
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.sources.reader import open_source
from onceflow.resources.delta_storage import delta_table
from onceflow.resources.lake import LakeResource

NAME = "ingest_throughput"
MODES = ("exactly_once", "at_least_once")


@dataclass(frozen=True)
class Config:
    events: int | None = None  # distinct valid records per data set; None: the data set's default
    files: int = 20
    files_per_batch: int = 4
    rounds: int = 3
    warm_ups: int = 2  # discarded passes of every contender before the timed rounds


@dataclass
class Run:
    mode: str
    round: int
    seconds: float
    received: int
    inserted: int
    duplicates: int
    batches: int
    batch_records: list[int]
    batch_seconds: list[float]
    raw_rows: int
    raw_distinct_ids: int
    dead_lettered: dict[str, int]
    load_avg_1m_before: float
    load_avg_1m_after: float
    rss_before_bytes: int
    peak_rss_bytes: int  # of the driver while timed (`bench.memory`)
    stage_ms: list[dict[str, float]]  # each batch's, by stage (`onceflow.jobs.ingest.stage_times`)

    @property
    def records_per_s(self) -> float:
        return self.received / self.seconds


def drain_once(
    spark: SparkSession,
    source: Source,
    mode: str,
    work: Path,
    round_no: int,
    home: Path | str | None = None,
) -> Run:
    """Drain the whole source into a fresh home with one delivery mode; times the drain only.

    The home is a new directory under `work`, removed afterwards; or `home`, an empty directory or a `gs://` URI
    the caller keeps (to look at the lake afterwards) and removes.
    """
    owned = home is None
    home = Path(tempfile.mkdtemp(prefix=f"home-{mode}-", dir=work)) if home is None else home
    try:
        pipeline = source.dataset.pipeline(source.directory, mode, source.files_per_batch)
        runtime = open_source(pipeline, LakeResource(home=str(home)))
        results: list[IngestResult] = []
        batch_seconds: list[float] = []
        load_before = os.getloadavg()[0]
        with PeakRss() as rss:
            start = time.perf_counter()
            while True:
                batch_start = time.perf_counter()
                result = run_micro_batch(lambda: spark, runtime)
                if result is None:
                    break
                batch_seconds.append(time.perf_counter() - batch_start)
                results.append(result)
            seconds = time.perf_counter() - start
        load_after = os.getloadavg()[0]
        ids = delta_table(runtime.raw_path).to_pyarrow_table(columns=["record_id"]).column("record_id")
        return Run(
            mode=mode,
            round=round_no,
            seconds=seconds,
            received=sum(r.received for r in results),
            inserted=sum(r.inserted for r in results),
            duplicates=sum(r.duplicates for r in results),
            batches=len(results),
            batch_records=[r.received for r in results],
            batch_seconds=batch_seconds,
            raw_rows=len(ids),
            raw_distinct_ids=pc.count_distinct(ids).as_py(),
            dead_lettered=_sum_counts(r.dead_lettered for r in results),
            load_avg_1m_before=load_before,
            load_avg_1m_after=load_after,
            rss_before_bytes=rss.before,
            peak_rss_bytes=rss.peak,
            stage_ms=[dict(r.times.ms) for r in results],
        )
    finally:
        if owned:
            shutil.rmtree(home, ignore_errors=True)


def _sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for reason, n in one.items():
            total[reason] = total.get(reason, 0) + n
    return dict(sorted(total.items()))


def check(run: Run, source: Source) -> None:
    """Fail loudly unless the raw table holds exactly what the mode promises, and the malformed lines are dead
    letters for the reasons the generator meant."""
    valid_lines = source.records - source.malformed
    expected_rows = source.events if run.mode == "exactly_once" else valid_lines
    problems = []
    if run.received != source.records:
        problems.append(f"received {run.received} records, expected {source.records}")
    if run.raw_rows != expected_rows:
        problems.append(f"raw table has {run.raw_rows} rows, expected {expected_rows}")
    if run.raw_distinct_ids != source.events:
        problems.append(f"raw table has {run.raw_distinct_ids} distinct record ids, expected {source.events}")
    if run.mode == "exactly_once" and run.duplicates != valid_lines - source.events:
        problems.append(f"{run.duplicates} duplicates dropped, expected {valid_lines - source.events}")
    if run.dead_lettered != dict(sorted(source.dead_letters.items())):
        problems.append(f"dead letters {run.dead_lettered}, expected {source.dead_letters}")
    if problems:
        raise BenchmarkError(f"{run.mode} round {run.round}: " + "; ".join(problems))
