"""Exactly-once vs at-least-once ingest throughput on the same data (DESIGN.md section 10, benchmark 1).

The same events plus 10% publisher-retry duplicates are written once as JSON-lines files; each run drains that
file source with `run_micro_batch` into a fresh onceflow home, on one shared Spark session. Only the drain is
timed (not file generation, not session start). After a small discarded warm-up the modes alternate
(A B A B ...) so both see the same machine conditions; the figure is the median records/s per mode.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
    warmup_events: int = 2_000

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


def run(spark: SparkSession, config: Config, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Warm up, then alternate the two modes for `config.rounds` rounds; returns the JSON-ready report."""
    log = log or _print
    os.environ.pop("ONCEFLOW_CRASH_AT", None)  # a leftover fault-injection setting would kill the benchmark
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as tmp:
        work = Path(tmp)
        warmup_dir, source_dir = work / "warmup", work / "source"
        write_source(warmup_dir, config.warmup_events, config, seed=3)
        lines_per_file = write_source(source_dir, config.events, config)
        warmup_records = config.warmup_events + int(config.warmup_events * config.retry_fraction)
        for mode in MODES:
            warm = drain_once(spark, warmup_dir, mode, config, work, round_no=0)
            check(warm, config.warmup_events, warmup_records)
            log(f"warm-up {mode}: {warm.received} records in {warm.seconds:.1f} s (discarded)")
        runs: list[Run] = []
        for round_no in range(1, config.rounds + 1):
            for mode in MODES:
                result = drain_once(spark, source_dir, mode, config, work, round_no)
                check(result, config.events, config.records)
                runs.append(result)
                log(
                    f"round {round_no} {mode}: {result.received} records, {result.batches} batches, "
                    f"{result.seconds:.1f} s, {result.records_per_s:,.0f} records/s, {result.raw_rows} raw rows "
                    f"(load {result.load_avg_1m_before:.2f} -> {result.load_avg_1m_after:.2f})"
                )
    return report(config, lines_per_file, runs)


def _print(line: str) -> None:
    print(line, flush=True)


def report(config: Config, lines_per_file: int, runs: list[Run]) -> dict[str, Any]:
    summary: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        mine = [r for r in runs if r.mode == mode]
        rates = [r.records_per_s for r in mine]
        summary[mode] = {
            "median_records_per_s": statistics.median(rates),
            "min_records_per_s": min(rates),
            "max_records_per_s": max(rates),
            "median_seconds": statistics.median(r.seconds for r in mine),
            "median_batch_seconds": statistics.median(s for r in mine for s in r.batch_seconds),
            "received": mine[0].received,
            "raw_rows": mine[0].raw_rows,
            "batches": mine[0].batches,
            "batch_records": mine[0].batch_records,
        }
    ratio = summary["exactly_once"]["median_records_per_s"] / summary["at_least_once"]["median_records_per_s"]
    return {
        "benchmark": NAME,
        "config": {
            **asdict(config),
            "records": config.records,
            "lines_per_file": lines_per_file,
            "records_per_batch": lines_per_file * config.files_per_batch,
            "order": "warm-up of each mode (discarded), then " + " ".join(MODES) + f" x {config.rounds}",
            "timed": "drain only: run_micro_batch until None (plan, read, ingest, checkpoint)",
        },
        "summary": summary,
        "ratio_exactly_once_over_at_least_once": ratio,
        "runs": [{**asdict(r), "records_per_s": r.records_per_s} for r in runs],
    }


def chart(result: dict[str, Any], path: Path) -> None:
    """Median records/s per mode (with each round's value), and every run in execution order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"exactly_once": "tab:blue", "at_least_once": "tab:orange"}
    summary, runs, config = result["summary"], result["runs"], result["config"]
    fig, (bars, order) = plt.subplots(1, 2, figsize=(11, 4.8), gridspec_kw={"width_ratios": [1, 1.4]})
    for x, mode in enumerate(MODES):
        median = summary[mode]["median_records_per_s"]
        bars.bar(x, median, color=colors[mode], alpha=0.8, width=0.6)
        rates = [r["records_per_s"] for r in runs if r["mode"] == mode]
        bars.scatter(
            [x] * len(rates), rates, color="black", s=14, zorder=3, label="one round" if x == 0 else None
        )
        bars.text(
            x,
            median / 2,
            f"median\n{median:,.0f}/s",
            ha="center",
            va="center",
            color="white",
            fontsize=10,
            fontweight="bold",
        )
    bars.set_xticks(range(len(MODES)), [f"{m}\n{summary[m]['raw_rows']:,} raw rows" for m in MODES])
    bars.set_ylabel("records / s (median)")
    bars.set_title(f"exactly_once / at_least_once = {result['ratio_exactly_once_over_at_least_once']:.2f}")
    bars.margins(y=0.15)
    bars.legend(loc="lower right", fontsize=8)

    for mode in MODES:
        points = [(i + 1, r["records_per_s"]) for i, r in enumerate(runs) if r["mode"] == mode]
        order.plot(*zip(*points, strict=True), "o-", color=colors[mode], label=mode)
    order.set_xlabel("run, in execution order (after a discarded warm-up)")
    order.set_ylabel("records / s")
    order.set_xticks(range(1, len(runs) + 1))
    order.set_ylim(bottom=0)
    order.set_title("every run (same files, fresh lake each run)")
    order.legend(fontsize=8)
    order.grid(alpha=0.3)

    fig.suptitle(
        f"Ingest throughput: {config['events']:,} events + {config['retry_fraction']:.0%} publisher retries = "
        f"{config['records']:,} records; {summary['exactly_once']['batches']} batches of "
        f"~{config['records_per_batch']:,} records; {os.cpu_count()} cores"
    )
    loads = [x for r in runs for x in (r["load_avg_1m_before"], r["load_avg_1m_after"])]
    fig.text(
        0.01,
        0.01,
        f"1-minute load average during the timed runs: {min(loads):.1f}-{max(loads):.1f}",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
