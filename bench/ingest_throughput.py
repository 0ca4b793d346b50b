"""Exactly-once vs at-least-once ingest throughput on the same data (DESIGN.md section 10, benchmark 1).

The same events plus 10% publisher-retry duplicates are written once as JSON-lines files; each run drains that
file source with `run_micro_batch` into a fresh onceflow home, on one shared Spark session. Only the drain is
timed (not file generation, not session start). `bench.run` runs the rounds, beside the other contenders.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs.declaration import FileSource, Pipeline
from jobs.ingest_result import IngestResult
from jobs.micro_batch import run_micro_batch
from jobs.source_reader import open_source
from orchestration.pipelines import resolve
from orchestration.pipelines.events import SCHEMA
from orchestration.workload import make_events, with_publisher_retries
from resources.lake import LakeResource
from resources.settings import load_settings

NAME = "ingest_throughput"
MODES = ("exactly_once", "at_least_once")
START_MS = 1_763_720_000_000
SPAN_MS = 6 * 3600 * 1000  # six hours of event time: a handful of hourly time buckets, all inside the horizon


class BenchmarkError(RuntimeError):
    """A run produced the wrong table: its timing would be meaningless."""


@dataclass(frozen=True)
class Config:
    events: int = 200_000
    retry_fraction: float = 0.10
    files: int = 20
    files_per_batch: int = 4
    rounds: int = 3

    @property
    def records(self) -> int:
        return self.events + int(self.events * self.retry_fraction)


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
    load_avg_1m_before: float
    load_avg_1m_after: float

    @property
    def records_per_s(self) -> float:
        return self.received / self.seconds


def write_source(directory: Path, events: int, config: Config, seed: int = 7) -> int:
    """Write the events plus publisher retries as `config.files` JSON-lines files; returns lines per file."""
    stream = with_publisher_retries(make_events(events, START_MS, SPAN_MS, seed=seed), config.retry_fraction)
    per_file = math.ceil(len(stream) / config.files)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(config.files):
        chunk = stream[i * per_file : (i + 1) * per_file]
        (directory / f"part-{i:03d}.jsonl").write_text("".join(f"{e.json_line()}\n" for e in chunk))
    return per_file


def pipeline_for(source_dir: Path, mode: str, config: Config) -> Pipeline:
    source = FileSource(
        directory=str(source_dir), id_field="event_id", timestamp_field="event_time", max_files=config.files_per_batch
    )
    return resolve(Pipeline(name="events", source=source, schema=SCHEMA, delivery=mode), load_settings())


def drain_once(
    spark: SparkSession,
    source_dir: Path,
    mode: str,
    config: Config,
    work: Path,
    round_no: int,
    home: Path | None = None,
) -> Run:
    """Drain the whole source into a fresh home with one delivery mode; times the drain only.

    The home is a new directory under `work`, removed afterwards; or `home`, an empty directory the caller keeps
    (to look at the lake afterwards) and removes.
    """
    owned = home is None
    home = Path(tempfile.mkdtemp(prefix=f"home-{mode}-", dir=work)) if home is None else home
    try:
        pipeline = pipeline_for(source_dir, mode, config)
        source = open_source(pipeline, LakeResource(home=str(home)))
        results: list[IngestResult] = []
        batch_seconds: list[float] = []
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        while True:
            batch_start = time.perf_counter()
            result = run_micro_batch(lambda: spark, source)
            if result is None:
                break
            batch_seconds.append(time.perf_counter() - batch_start)
            results.append(result)
        seconds = time.perf_counter() - start
        load_after = os.getloadavg()[0]
        ids = DeltaTable(source.raw_path).to_pyarrow_table(columns=["record_id"]).column("record_id")
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
            load_avg_1m_before=load_before,
            load_avg_1m_after=load_after,
        )
    finally:
        if owned:
            shutil.rmtree(home, ignore_errors=True)


def check(run: Run, events: int, records: int) -> None:
    """Fail loudly unless the raw table holds exactly what the mode promises."""
    expected_rows = events if run.mode == "exactly_once" else records
    problems = []
    if run.received != records:
        problems.append(f"received {run.received} records, expected {records}")
    if run.raw_rows != expected_rows:
        problems.append(f"raw table has {run.raw_rows} rows, expected {expected_rows}")
    if run.raw_distinct_ids != events:
        problems.append(f"raw table has {run.raw_distinct_ids} distinct record ids, expected {events}")
    if run.mode == "exactly_once" and run.duplicates != records - events:
        problems.append(f"{run.duplicates} duplicates dropped, expected {records - events}")
    if problems:
        raise BenchmarkError(f"{run.mode} round {run.round}: " + "; ".join(problems))
