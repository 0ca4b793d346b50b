"""Exactly-once vs at-least-once ingest throughput on the same data (docs/design.md section 10, benchmark 1).

A data set (`bench.datasets`) is written once as JSON-lines files; each run drains that file source into a fresh
onceflow home, on one shared Spark session: `exactly_once` and `at_least_once` call `run_micro_batch` until the
source is drained; `exactly_once_dagster` runs it as users do, through the pipeline's Dagster job (see
`_drain_by_job`). Only the drain is timed (not file generation, not session start). `bench.run` runs the rounds,
beside the other contenders.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from bench.datasets import BenchmarkError, Source
from bench.memory import PeakRss
from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest_job import build_ingest_job
from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.deployments import LAKE, PUBSUB, SPARK
from onceflow.resources.delta_storage import delta_table
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource
from onceflow.resources.settings import load_settings
from onceflow.resources.spark import SparkResource

NAME = "ingest_throughput"
MODES = ("exactly_once", "at_least_once")
THROUGH_DAGSTER = "exactly_once_dagster"
CONTENDERS = (*MODES, THROUGH_DAGSTER)
WORKER_RUN_S = 6.0
"""How long each worker run of `exactly_once_dagster` takes batches: longer than a drain, so one run drains the
data set (a run that ends first is followed by another, as the sensor would launch it)."""
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


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


@dataclass(frozen=True)
class Batch:
    """One committed batch, as its run reported it."""

    received: int
    inserted: int
    duplicates: int
    dead_lettered: dict[str, int]
    seconds: float
    stage_ms: dict[str, float]


def drain_once(
    spark: SparkSession,
    source: Source,
    contender: str,
    work: Path,
    round_no: int,
    home: Path | str | None = None,
) -> Run:
    """Drain the whole source into a fresh home as `contender` (one of `CONTENDERS`); times the drain only.

    The home is a new directory under `work`, removed afterwards; or `home`, an empty directory or a `gs://` URI
    the caller keeps (to look at the lake afterwards) and removes.
    """
    mode = "exactly_once" if contender == THROUGH_DAGSTER else contender
    owned = home is None
    home = Path(tempfile.mkdtemp(prefix=f"home-{mode}-", dir=work)) if home is None else home
    try:
        pipeline = source.dataset.pipeline(source.directory, mode, source.files_per_batch)
        lake = LakeResource(home=str(home))
        load_before = os.getloadavg()[0]
        with PeakRss() as rss:
            if contender == THROUGH_DAGSTER:
                seconds, batches = _drain_by_job(pipeline, lake, work, source.records)
            else:
                seconds, batches = _drain_by_calls(spark, pipeline, lake)
        load_after = os.getloadavg()[0]
        ids = delta_table(open_source(pipeline, lake).raw_path).to_pyarrow_table(columns=["record_id"])
        return Run(
            mode=mode,
            round=round_no,
            seconds=seconds,
            received=sum(b.received for b in batches),
            inserted=sum(b.inserted for b in batches),
            duplicates=sum(b.duplicates for b in batches),
            batches=len(batches),
            batch_records=[b.received for b in batches],
            batch_seconds=[b.seconds for b in batches],
            raw_rows=ids.num_rows,
            raw_distinct_ids=pc.count_distinct(ids.column("record_id")).as_py(),
            dead_lettered=_sum_counts(b.dead_lettered for b in batches),
            load_avg_1m_before=load_before,
            load_avg_1m_after=load_after,
            rss_before_bytes=rss.before,
            peak_rss_bytes=rss.peak,
            stage_ms=[b.stage_ms for b in batches],
        )
    finally:
        if owned:
            shutil.rmtree(home, ignore_errors=True)


def _drain_by_calls(spark: SparkSession, pipeline: Pipeline, lake: LakeResource) -> tuple[float, list[Batch]]:
    """`run_micro_batch` until the source has no new data: the seconds that took, and the batches."""
    runtime = open_source(pipeline, lake)
    batches: list[Batch] = []
    start = time.perf_counter()
    while True:
        batch_start = time.perf_counter()
        result = run_micro_batch(lambda: spark, runtime)
        if result is None:
            return time.perf_counter() - start, batches
        batches.append(Batch(result.received, result.inserted, result.duplicates, result.dead_lettered,
                             time.perf_counter() - batch_start, dict(result.times.ms)))


def _drain_by_job(pipeline: Pipeline, lake: LakeResource, work: Path, records: int) -> tuple[float, list[Batch]]:
    """The source drained as users run it: worker runs (`WORKER_RUN_S`) of the pipeline's Dagster job
    `ingest_<name>`, one after another until its `records` are in, executed in this process on a Dagster instance
    of its own (SQLite, in a temporary directory), its Spark resource handing out this process's session (or one
    of the same Spark Connect server). Timed from the first run's start to the last batch's commit, as its
    materialization records it; the batches are the materializations' figures."""
    job = build_ingest_job(pipeline, run_s=WORKER_RUN_S)
    settings = load_settings()  # the engine a run gets: this session's, or its Spark Connect server (`--engine`)
    resources = {SPARK: SparkResource(master=settings.spark_master, remote=settings.spark_remote), LAKE: lake,
                 PUBSUB: PubSubResource()}
    batches: list[Batch] = []
    with (tempfile.TemporaryDirectory(prefix="dagster-", dir=work) as dagster_home,
          dg.DagsterInstance.local_temp(dagster_home) as instance):
        start_ms, committed_ms = time.time() * 1000, 0.0
        while sum(b.received for b in batches) < records:
            ran = job.execute_in_process(instance=instance, resources=resources, run_config=QUIET)
            reported = [event.event_specific_data.materialization.metadata for event in ran.all_events
                        if event.event_type_value == "ASSET_MATERIALIZATION"]
            if not reported:
                raise BenchmarkError(f"a run of {job.name} committed no batch; {records} records not drained")
            batches += [_reported(metadata) for metadata in reported]
            committed_ms = max(metadata["committed_at_ms"].value for metadata in reported)
    return (committed_ms - start_ms) / 1000, batches


def _reported(metadata: Mapping[str, Any]) -> Batch:
    """A batch from its materialization's metadata (`onceflow.jobs.ingest_job.ingest_metadata`)."""
    value = {key: entry.value for key, entry in metadata.items()}
    return Batch(
        received=value["records_read"],
        inserted=value["inserted"],
        duplicates=value["duplicates_in_batch"] + value["duplicates_already_committed"]
        + value["dead_letter_duplicates"],
        dead_lettered={key.removeprefix("dead_lettered_"): n for key, n in value.items()
                       if key.startswith("dead_lettered_")},
        seconds=(value["committed_at_ms"] - value["requested_at_ms"]) / 1000,
        stage_ms={key.removesuffix("_ms"): ms for key, ms in value.items()
                  if key.endswith("_ms") and not key.endswith("_at_ms")},
    )


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
