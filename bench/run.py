"""Run the benchmarks: `python -m bench.run [--dataset clean|realistic|flights|all] [--only NAME] [--events N]
[--rounds N] [--engine classic|connect]` (`make bench`).

One process, one Spark session (started before any timing); per data set (`bench.datasets`: `clean`, events
plus 10% publisher retries; `realistic`, a clickstream as producers write it; `flights`, data onceflow did not
design: a year of real departures, `bench.flights`), the same JSON-lines files are ingested by every contender —

- `exactly_once`, `at_least_once`: onceflow's micro-batches (`bench.ingest_throughput.drain_once`);
- `exactly_once_dagster`: exactly-once as users run it, worker runs of the pipeline's Dagster job `ingest_<name>`;
- `streaming_dedup`, `streaming_merge`: the Spark Structured Streaming peer (`bench.peer`);
- `floor`: a plain `read.json` -> Delta append, no dedup (`bench.peer`).

After two discarded warm-up rounds of every contender on the same data, the rounds alternate all contenders, in that
order and then in reverse (see `run_contenders`), each run starting once the disk has written back the runs
before it (`os.sync`), their garbage is collected (the JVM's and Python's) and the JIT compilations they queued
are done; each figure is the median records/s per contender. Only the ingest itself is timed (see
each module). After
each timed run of `exactly_once` and of the streams, the last batch is replayed as after a crash between the sink
commit and the checkpoint update, and the duplicates the table then holds are counted (not timed). Every table
is compared with onceflow exactly-once's valid rows (`bench.same_rows`; not timed); the peak resident memory of
the driver during each run is sampled (`bench.memory`).

Then `table_growth` (`--growth-*`), `loaded_growth` (the same sizes, tables filled by onceflow batch by batch:
`bench/loaded_growth.py`), `redelivery` (`--redelivery-*`), `latency` (`--latency-*`), `landing`
(`--landing-*`), `kafka` (`--kafka-*`) and `profiles` (`--profile-*`): `bench/table_growth.py`,
`bench/redelivery.py` (the exact lookup of redelivered old records as the table grows), `bench/latency.py`,
`bench/landing.py` (`--only landing` runs the Pub/Sub landing figure alone), `bench/kafka.py` (Kafka -> raw against
Structured Streaming's Kafka source), `kafka_postgres` (`bench/kafka_postgres.py`: Kafka -> PostgreSQL through a
record output, against `foreachBatch` JDBC appends), `sink_latency` (`bench/sink_latency.py`: raw commit -> each
record sink), `bench/profiles.py` (exactly-once on the `cluster-gcs` profile against
`local`, each in its own process).
With `--engine connect` the contenders are clients of a Spark Connect server on `local[2]` instead (what `make dev`
and the demo run on), and the other benchmarks do not run.
The driver's peak resident memory is recorded for each of these too (`peak_rss_bytes`), and the commit the
figures are of (`commit`). Writes `bench/results/latest.json` and the chart `bench/results/latest.png` (see `bench/report.py`).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from bench import chart, ingest_throughput, peer, report
from bench.datasets import CLEAN, BenchmarkError, Dataset, Source
from bench.flights import FLIGHTS
from bench.ingest_throughput import Config
from bench.kafka import BATCH as KAFKA_BATCH
from bench.kafka import EVENTS as KAFKA_EVENTS
from bench.kafka import ROUNDS as KAFKA_ROUNDS
from bench.kafka import kafka
from bench.kafka_postgres import jdbc_jar, kafka_postgres
from bench.landing import EVENTS as LANDING_EVENTS
from bench.landing import ROUNDS as LANDING_ROUNDS
from bench.landing import landing
from bench.latency import BURST_EVENTS, BURSTS, DRAIN_EVENTS, latency
from bench.loaded_growth import loaded_growth
from bench.memory import PeakRss
from bench.profiles import EVENTS as PROFILE_EVENTS
from bench.profiles import ROUNDS as PROFILE_ROUNDS
from bench.profiles import profiles
from bench.realistic import REALISTIC
from bench.redelivery import ROUNDS as REDELIVERY_ROUNDS
from bench.redelivery import SIZES as REDELIVERY_SIZES
from bench.redelivery import redelivery
from bench.same_rows import Judge
from bench.sink_latency import LATENCY_BATCH, sink_latency
from bench.table_growth import BATCH_RECORDS, BATCHES, SIZES, parse_sizes, table_growth
from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.checkpoint import SourceCheckpoint
from onceflow.jobs.sources.reader import open_source
from onceflow.resources.lake import LakeResource
from onceflow.resources.spark import build_spark_session
from onceflow.resources.spark_connect import start_spark_connect_server

RESULTS = Path(__file__).resolve().parent / "results"
ONCEFLOW = ingest_throughput.CONTENDERS  # exactly_once, at_least_once, exactly_once_dagster
MODES = ingest_throughput.MODES  # exactly_once, at_least_once: the two delivery modes, run the same way
CONTENDERS = (*ONCEFLOW, *peer.CONTENDERS)
EXTRAS = ("table_growth", "loaded_growth", "redelivery", "latency", "landing", "kafka", "kafka_postgres", "sink_latency",
          "profiles")
ALIASES = {"ingest_throughput": ONCEFLOW}
DATASETS = {d.name: d for d in (CLEAN, REALISTIC, FLIGHTS)}


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import pyspark

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "delta_spark": version("delta-spark"),
        "deltalake": version("deltalake"),
        "total_memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }


def source_commit() -> dict[str, Any]:
    """The commit of onceflow the figures are of, and whether the working tree differed from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"sha": git("rev-parse", "HEAD") or None,
            "modified_files": git("diff", "--name-only", "HEAD").splitlines()}  # tracked files changed since it


def with_memory(benchmark: Callable[..., dict[str, Any] | None], *args: Any) -> dict[str, Any] | None:
    """`benchmark(*args)`'s result, with the driver's resident memory before it and its peak while it ran
    (`peak_rss_bytes`, `rss_before_bytes`; `bench.memory`: the servers it starts are not counted)."""
    with PeakRss() as rss:
        result = benchmark(*args)
    return None if result is None else {**result, "rss_before_bytes": rss.before, "peak_rss_bytes": rss.peak}


def replay_last_batch(spark: SparkSession, files: Source, home: Path) -> dict[str, Any]:
    """The fault the peer's replay check injects, on onceflow: the lake committed the last batch, but the
    checkpoint's advance past it was lost. Roll the checkpoint back one batch, run the next micro-batch as the
    sensor would, and count rows minus distinct record ids in the raw table. Not timed."""
    pipeline = files.dataset.pipeline(files.directory, "exactly_once", files.files_per_batch)
    source = open_source(pipeline, LakeResource(home=str(home)))
    last = source.checkpoints.load().committed_batch
    plan = source.checkpoints.get_plan(last)
    if plan is None:
        raise BenchmarkError(f"exactly_once: the plan of batch {last} was not kept; cannot replay it")
    before = DeltaTable(source.raw_path).version()

    def roll_back(checkpoint: SourceCheckpoint) -> SourceCheckpoint:
        checkpoint.committed_batch = last - 1
        replayed = {entry.path for entry in plan.files}
        checkpoint.taken_files = [path for path in checkpoint.taken_files if path not in replayed]
        return checkpoint

    source.checkpoints.update(roll_back)
    start = time.perf_counter()
    result = run_micro_batch(lambda: spark, source)
    seconds = time.perf_counter() - start
    if result is None or result.batch_id != last:
        raise BenchmarkError(f"exactly_once: after the roll-back the next batch was {result and result.batch_id}, "
                             f"not {last}")
    ids = DeltaTable(source.raw_path).to_pyarrow_table(columns=["record_id"]).column("record_id")
    return {
        "duplicates_after_replay": len(ids) - pc.count_distinct(ids).as_py(),
        "replay": {"replayed_batch": last, "skipped_as_committed": result.replayed, "seconds": seconds,
                   "table_commits": DeltaTable(source.raw_path).version() - before},
    }


def _compilers_settle(spark: SparkSession, quiet_ms: int = 10, window_s: float = 0.5, most_s: float = 30.0) -> float:
    """Wait until the JVM's JIT compilers have been nearly idle (at most `quiet_ms` of compilation in `window_s`),
    at most `most_s`; the seconds waited. The compilations the runs before queued (and the checks of their tables)
    are theirs: finishing during the next run, they took its CPU, bursts of 0.2-3 s that landed on one contender or
    another."""
    compilation = spark._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
    start = time.perf_counter()
    before = compilation.getTotalCompilationTime()
    while time.perf_counter() - start < most_s:
        time.sleep(window_s)
        now = compilation.getTotalCompilationTime()
        if now - before <= quiet_ms:
            break
        before = now
    return time.perf_counter() - start


def run_one(
    spark: SparkSession, contender: str, source: Source, work: Path, round_no: int, replay: bool, judge: Judge
) -> dict[str, Any]:
    """One checked run of `contender` over `source`; the JSON-ready record of it."""
    # The disk's write-back of the runs before is done first: onceflow's checkpoints fsync, and would otherwise wait
    # for the files another contender just wrote or deleted. And the garbage of the runs before is collected (the
    # JVM's and Python's), and the JIT compilations they queued finished, rather than left for whichever contender
    # runs next to pay for.
    os.sync()
    gc.collect()
    compiling = 0.0
    if hasattr(spark, "_jsparkSession"):  # over Spark Connect the engine's JVM is the server's, out of reach
        spark._jvm.System.gc()
        compiling = _compilers_settle(spark)
    if contender not in ONCEFLOW:
        run = peer.run_contender(spark, contender, source, work, round_no, replay=replay,
                                 examine=lambda table: judge.peer(contender, round_no, table))
        peer.check(run, source)
        record = {**asdict(run), "records_per_s": run.records_per_s, "same_rows": run.examined,
                  "compilers_settled_s": compiling}
        record.pop("examined")
        return record
    home = Path(tempfile.mkdtemp(prefix=f"home-{contender}-", dir=work))
    try:
        drained = ingest_throughput.drain_once(spark, source, contender, work, round_no, home)
        ingest_throughput.check(drained, source)
        tables = open_source(source.dataset.pipeline(source.directory, drained.mode, source.files_per_batch),
                             LakeResource(home=str(home)))
        record = {
            "contender": contender, "round": round_no, "seconds": drained.seconds, "records": drained.received,
            "rows": drained.raw_rows, "distinct_ids": drained.raw_distinct_ids,
            "records_per_s": drained.records_per_s, "duplicates_after_replay": None, **asdict(drained),
            "same_rows": judge.onceflow(contender, round_no, tables.raw_path, tables.dead_letter_path),
            "compilers_settled_s": compiling,
        }
        if replay and contender == "exactly_once":
            record.update(replay_last_batch(spark, source, home))
        return record
    finally:
        IdFilterStore.forget()  # the filters of this run's tables, which go with its home, are not kept in memory
        shutil.rmtree(home, ignore_errors=True)


def run_contenders(
    spark: SparkSession, dataset: Dataset, contenders: list[str], config: Config, log: Callable[[str], None]
) -> dict[str, Any]:
    """`config.warm_ups` warm-up rounds (discarded), then `config.rounds` rounds of every contender, on the same
    files of `dataset`: what the files held, and the runs.

    Each warm-up is the full data set: the JVM compiles its hot paths for the batch size being measured, which a
    small warm-up left for the first timed rounds to pay (those got faster round after round). After one warm-up,
    exactly-once's first timed round still ran 25-30 % slower than its later ones (code run a few times a batch is
    compiled only after some batches): every contender gets two. The timed rounds
    run the contenders in order, then in reverse, and so on, so that no contender always runs first in its round
    or always after the same neighbour. The warm-up's exactly-once run is the reference every table is compared to.
    """
    os.environ.pop("ONCEFLOW_CRASH_AT", None)  # a leftover fault-injection setting would kill the benchmark
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as tmp:
        work = Path(tmp)
        events = config.events or dataset.default_events
        source = Source.write(dataset, work / "source", events, config.files, config.files_per_batch)
        judge = Judge(source)
        log(f"{dataset.name}: {source.records:,} lines, {source.events:,} distinct valid records, "
            f"{source.detail}, malformed {source.dead_letters}")
        if "exactly_once" not in contenders:
            log(f"{dataset.name}: exactly_once does not run: no table is compared with its valid rows")
        for _ in range(config.warm_ups):
            for contender in contenders:
                warm = run_one(spark, contender, source, work, 0, replay=False, judge=judge)
                log(f"{dataset.name} warm-up {contender}: {warm['records']} records in {warm['seconds']:.1f} s "
                    f"(discarded){_same_rows(warm['same_rows'])}")
        for round_no in range(1, config.rounds + 1):
            order = contenders if round_no % 2 else contenders[::-1]
            # Then the two ingest modes again, in the other order and then in the first: exactly-once ÷
            # at-least-once is a cost of a few per cent, measured between 2-second runs of which two of one mode
            # differed by up to 0.72; with each mode's three runs placed A B ... B A A B, their sums share the
            # round's drift, and one slow run moves them by less.
            modes = [c for c in order if c in MODES]
            again = [*modes[::-1], *modes] if set(MODES) <= set(contenders) else []
            for contender, second in [*((c, False) for c in order), *((c, True) for c in again)]:
                run = {**run_one(spark, contender, source, work, round_no, replay=not second, judge=judge),
                       "second_pass": second}
                runs.append(run)
                replayed = run["duplicates_after_replay"]
                log(
                    f"{dataset.name} round {round_no}{' (again)' if second else ''} {contender}: {run['records']} "
                    f"records, {run['seconds']:.1f} s, "
                    f"{run['records_per_s']:,.0f} records/s, {run['rows']} rows, {run['distinct_ids']} distinct"
                    + ("" if replayed is None else f", {replayed} duplicates after replay")
                    + "".join(f" [a replay run failed: {f}]" for f in run.get("replay", {}).get("failed_runs", []))
                    + f", peak RSS {run['peak_rss_bytes'] / 2**20:,.0f} MiB"
                    + f" (load {run['load_avg_1m_before']:.2f} -> {run['load_avg_1m_after']:.2f})"
                    + _same_rows(run["same_rows"])
                )
    files = {"lines": source.records, "events": source.events, **source.detail, "malformed": source.dead_letters}
    return {"dataset": dataset.name, "description": dataset.description, "events": events, "files": files,
            "runs": runs}


def _same_rows(same: dict[str, Any] | None) -> str:
    if same is None:
        return ""
    return (f"; same valid rows as exactly_once ({same['valid_rows']} rows of valid records"
            + "".join(f", {n} kept that onceflow dead-lettered as {reason}"
                      for reason, n in same["kept_dead_letters"].items())
            + (f", {same['other_rows']} other rows" if same["other_rows"] else "") + ")")


def _print(line: str) -> None:
    print(line, flush=True)


def selected(only: list[str] | None) -> tuple[list[str], set[str]]:
    """The contenders (in their fixed order) and the extra benchmarks `--only` asks for (all without it)."""
    if not only:
        return list(CONTENDERS), set(EXTRAS)
    names = {n for name in only for n in ALIASES.get(name, (name,))}
    return [c for c in CONTENDERS if c in names], names & set(EXTRAS)


def spark_benchmarks(
    args: argparse.Namespace, contenders: list[str], extras: set[str], config: Config
) -> tuple[dict[str, str], list[dict[str, Any]], dict[str, Any | None]]:
    """The benchmarks that need Spark, on one session (none is started when none of them is asked for): its
    settings, the data sets' runs, and `table_growth`, `latency` and `kafka` by name (None when not asked for)."""
    extra = {"table_growth": table_growth, "loaded_growth": loaded_growth, "latency": latency, "kafka": kafka,
             "kafka_postgres": kafka_postgres, "sink_latency": sink_latency}
    if not contenders and not extras & set(extra):
        return {}, [], dict.fromkeys(extra)
    conf = {"spark.sql.warehouse.dir": "", "spark.driver.memory": "2g"}
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-warehouse-") as warehouse, ExitStack() as stack:
        conf["spark.sql.warehouse.dir"] = warehouse
        if args.engine == "connect":
            server = start_spark_connect_server("local[2]", conf=conf)
            stack.callback(server.stop)
            stack.enter_context(_environment(ONCEFLOW_SPARK_REMOTE=server.url))  # the Dagster contender's runs too
            spark = build_spark_session(remote=server.url)
        else:
            # The Kafka -> PostgreSQL peer writes over JDBC: the driver's jar is on the session from its start.
            jars = [jdbc_jar()] if "kafka_postgres" in extras else []
            spark = build_spark_session(app_name="onceflow-bench", conf=conf, jars=jars)
            stack.callback(spark.stop)
        settings = {k: spark.conf.get(k, None) for k in report.SPARK_SETTINGS}
        names = list(DATASETS) if args.dataset == "all" else [args.dataset]
        datasets = [run_contenders(spark, DATASETS[n], contenders, config, _print) for n in names if contenders]
        results = {name: with_memory(run, spark, args) if name in extras else None for name, run in extra.items()}
    return settings, datasets, results


@contextmanager
def _environment(**variables: str) -> Iterator[None]:
    """`variables` set in this process's environment while the block runs."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", choices=[*DATASETS, "all"], default="all",
                        help="the data set(s) the contenders ingest (default: all)")
    parser.add_argument("--engine", choices=["classic", "connect"], default="classic",
                        help="the contenders' session: classic, in this process (default), or a client of a Spark "
                             "Connect server on local[2] that this process starts (contenders only: the other "
                             "benchmarks are not run)")
    parser.add_argument(
        "--only", choices=[*CONTENDERS, *EXTRAS, *ALIASES], action="append",
        help="run only these (repeatable); ratios that lack a contender are null",
    )
    defaults = Config()
    parser.add_argument("--events", type=int, default=None,
                        help="distinct valid records per data set (default: "
                        + ", ".join(f"{d.name} {d.default_events:,}" for d in DATASETS.values()) + ")")
    parser.add_argument("--rounds", type=int, default=defaults.rounds,
                        help=f"timed rounds per contender (default {defaults.rounds})")
    parser.add_argument("--warm-ups", type=int, default=defaults.warm_ups,
                        help=f"discarded passes of every contender first (default {defaults.warm_ups})")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help=f"output directory (default: {RESULTS})"
    )
    growth = parser.add_argument_group("table_growth")
    growth.add_argument("--growth-rows", type=parse_sizes, default=SIZES, metavar="N,N",
                        help=f"raw table sizes (default: {','.join(map(str, SIZES))})")
    growth.add_argument("--growth-batches", type=int, default=BATCHES,
                        help="timed batches per size and home (default: %(default)s)")
    growth.add_argument("--growth-batch-records", type=int, default=BATCH_RECORDS,
                        help="records per timed batch (default: %(default)s)")
    again = parser.add_argument_group("redelivery")
    again.add_argument("--redelivery-rows", type=parse_sizes, default=REDELIVERY_SIZES, metavar="N,N",
                       help=f"raw table sizes (default: {','.join(map(str, REDELIVERY_SIZES))})")
    again.add_argument("--redelivery-rounds", type=int, default=REDELIVERY_ROUNDS,
                       help="timed lookups per table and redelivery (default: %(default)s)")
    lat = parser.add_argument_group("latency")
    lat.add_argument("--latency-bursts", type=int, default=BURSTS,
                     help="timed publish -> commit bursts (default: %(default)s)")
    lat.add_argument("--latency-burst-events", type=int, default=BURST_EVENTS,
                     help="events per burst (default: %(default)s)")
    lat.add_argument("--latency-drain-events", type=int, default=DRAIN_EVENTS,
                     help="events published, then drained, for landed_records_per_s (default: %(default)s)")
    land = parser.add_argument_group("landing")
    land.add_argument("--landing-events", type=int, default=LANDING_EVENTS,
                      help="events published, then landed, per timed run (default: %(default)s)")
    land.add_argument("--landing-rounds", type=int, default=LANDING_ROUNDS,
                      help="timed rounds per mode (default: %(default)s)")
    land.add_argument("--landing-streams", type=int, default=None,
                      help="pulls in flight of the parallel mode (default: ONCEFLOW_PULL_STREAMS)")
    kafka_group = parser.add_argument_group("kafka")
    kafka_group.add_argument("--kafka-events", type=int, default=KAFKA_EVENTS,
                             help="distinct events produced to the topic (default: %(default)s)")
    kafka_group.add_argument("--kafka-rounds", type=int, default=KAFKA_ROUNDS,
                             help="timed rounds per contender (default: %(default)s)")
    kafka_group.add_argument("--kafka-batch", type=int, default=KAFKA_BATCH,
                             help="records per batch of every contender (default: %(default)s)")
    kafka_group.add_argument("--sink-latency-batch", type=int, default=LATENCY_BATCH,
                             help="records per batch of sink_latency's drains (default: %(default)s)")
    profile_group = parser.add_argument_group("profiles")
    profile_group.add_argument("--profile-events", type=int, default=PROFILE_EVENTS,
                               help="distinct events of the clean data set each profile drains (default: %(default)s)")
    profile_group.add_argument("--profile-rounds", type=int, default=PROFILE_ROUNDS,
                               help="timed drains per profile (default: %(default)s)")
    args = parser.parse_args(argv)
    contenders, extras = selected(args.only)
    if args.engine == "connect":
        extras = set()
    config = Config(events=args.events, rounds=args.rounds, warm_ups=args.warm_ups)
    args.results.mkdir(parents=True, exist_ok=True)
    started, load_before = time.time(), os.getloadavg()
    settings, datasets, extra = spark_benchmarks(args, contenders, extras, config)
    landed = with_memory(landing, args) if "landing" in extras else None
    result = report.build(config, datasets, extra["table_growth"], extra["latency"], landed)
    result["redelivery"] = with_memory(redelivery, args) if "redelivery" in extras else None
    result["loaded_growth"] = extra["loaded_growth"]
    result["kafka"] = extra["kafka"]
    result["kafka_postgres"] = extra["kafka_postgres"]
    result["sink_latency"] = extra["sink_latency"]
    result["profiles"] = with_memory(profiles, args) if "profiles" in extras else None
    result["machine"] = {**machine(), "load_avg_before": load_before, "load_avg_after": os.getloadavg()}
    result["commit"] = source_commit()
    result["spark"] = settings
    result["engine"] = args.engine
    result["started_at"] = datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
    result["elapsed_s"] = round(time.time() - started, 1)
    result["command"] = " ".join([Path(sys.executable).name, "-m", "bench.run", *sys.argv[1:]])
    json_path, png_path = report.write(result, args.results), args.results / "latest.png"
    chart.chart(result, png_path)
    print(report.table(result), flush=True)
    print(f"wrote {json_path} and {png_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
