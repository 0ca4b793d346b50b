"""The chaos harness: one continuous workload, many overlapping faults, then an exact account.

Two pipelines (`tests.chaos.pipelines`) read Pub/Sub (the emulator) under a short ack deadline (redeliveries),
fed by publishers with retries, out-of-order, late and malformed records, while the real sensors on a real
`dagster-daemon` drive them and `tests.chaos.faults` injects K faults racing them. When the traffic and the faults
are over and everything has settled, the end state is read with independent readers and compared with what was
sent: raw and dead letters with delta-rs against the publishers' own records, every window against its pinned
input and its published files (`onceflow verify`'s reconciliation), BigQuery against the window table, and the
record output `events_clean` in PostgreSQL (and on Kafka) against raw, each record once.

    python -m tests.chaos.harness --iterations 30 [--seed N] [--engine connect|classic] [--profile local|cluster-gcs]
                                  [--source pubsub|kafka]

prints one summary line (the engine path it proved, faults by kind, records published, `lost 0, duplicated 0`,
the seed); a failing seed replays with `--seed`. `--engine classic` runs every run on its own local Spark session
(Delta's writer writes, delta-rs commits) instead of as a client of one warm Spark Connect engine. `--profile
cluster-gcs` runs it all on a standalone Spark cluster, with the whole home on the GCS emulator and Dagster on
PostgreSQL (`onceflow.orchestration.local_stack.PROFILES`). `--source kafka` puts the `events` pipeline on a
Kafka topic of three partitions on a real KRaft broker (its publisher a Kafka producer with the same retries, late
and malformed records), beside `orders` on Pub/Sub.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import dagster as dg
from deltalake.exceptions import TableNotFoundError
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import BigQuerySink
from onceflow.jobs.ingest_job import raw_asset_key
from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import sequence_id
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.verify.reconcile import canonical_row, render
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.orchestration.cli.sink_audit import audit_record_outputs
from onceflow.orchestration.cli.verify import reconcile_pipeline, reconcile_record_outputs
from onceflow.orchestration.deployments import PUBSUB, resources_for
from onceflow.orchestration.local_stack import PROFILES, LocalStack, local_stack
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.run_launcher import LAUNCHED_BY_TAG
from onceflow.orchestration.workload import KAFKA_MALFORMED, MALFORMED, KafkaEventsClient, Publisher
from onceflow.resources.delta_storage import delta_table
from onceflow.resources.settings import load_settings
from onceflow.resources.spark import build_spark_session
from tests.chaos.faults import FaultInjector
from tests.chaos.operator_faults import Extra
from tests.chaos.workload import OrderPublisher
from tests.delta_reader import read_rows

SETTINGS = {
    "ONCEFLOW_PIPELINES": "tests.chaos.pipelines",
    "ONCEFLOW_PUBSUB_PROJECT": "onceflow-chaos",
    "ONCEFLOW_MAX_MESSAGES": "500",
    "ONCEFLOW_MAX_SECONDS": "2",
    "ONCEFLOW_ACK_DEADLINE_S": "10",  # short leases: redeliveries
    "ONCEFLOW_ALLOWED_LATENESS_S": "10",
    "ONCEFLOW_WATERMARK_BAND_S": "5",
    "ONCEFLOW_WATERMARK_IDLE_S": "10",
    "ONCEFLOW_IDLE_TICK_S": "5",
    "ONCEFLOW_BIGQUERY_DATASET": "onceflow_chaos",
    "ONCEFLOW_RUN_START_TIMEOUT_S": "20",  # a run killed in its first second holds its source this long
}
WARM_RUNS = {
    # A run keeps taking batches for a while, as `make demo`'s do: on the classic path, where each run starts a Spark
    # of its own, and on Kafka, whose reader's read-ahead (recorded on rules of its own) only a warm run uses.
    "ONCEFLOW_MICRO_BATCH_RUN_S": "30",
}


@dataclass
class ChaosReport:
    seed: int
    engine_path: str
    profile: str
    source: str
    faults: Counter[str]
    published: int = 0
    records: int = 0
    malformed: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    launches: Counter[str] = field(default_factory=Counter)
    read_ahead: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.problems)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "none"
        return (f"chaos seed {self.seed} on the {self.engine_path} engine path, {self.profile} profile: {sum(self.faults.values())} faults ({kinds}); {self.published} messages "
                f"published ({self.records} records, {self.malformed} malformed) over 2 pipelines (events on "
                f"{self.source}); "
                f"{sum(self.launches.values())} runs ({self.launches['standby']} launched in standby processes), "
                f"{self.read_ahead} batches read ahead; "
                f"lost {len(self.lost)}, duplicated {len(self.duplicated)}; {len(self.problems)} other problems; "
                f"{self.elapsed_s:.0f}s")


def run_chaos(
    iterations: int, seed: int, publish_s: float = 60.0, settle_s: float = 600.0, engine_path: str = "connect",
    profile: str = "local", source: str = "pubsub",
) -> ChaosReport:
    started = time.monotonic()
    # The working directory (instance, lake, logs) is kept for inspection; removed when the run held.
    warm = engine_path == "classic" or source == "kafka"
    settings = SETTINGS | (WARM_RUNS if warm else {}) | {"ONCEFLOW_EVENTS_SOURCE": source}
    # `events` publishes every record to a PostgreSQL table (and, on Kafka, to a topic): sinks under the faults too.
    records = ("postgres", "kafka") if source == "kafka" else ("postgres",)
    with local_stack(settings, "onceflow-chaos-", keep=True, say=_say, engine_path=engine_path,
                     kafka=source == "kafka", records=records, **PROFILES[profile]) as stack:
        workdir = stack.workdir
        settings = load_settings()
        pipelines = load_pipelines(settings)
        client = resources_for(settings)[PUBSUB].client()
        closes = CloseStore(stack.lake.panes(), "event_counts")

        def first_closed() -> str | None:
            windows = closes.windows(60)
            return windows[0].key if windows else None

        if stack.kafka is not None:
            events = Publisher(KafkaEventsClient(stack.kafka.bootstrap), "onceflow-events", publish_s, rate=10,
                               first_closed=first_closed, seed=seed, malformed=KAFKA_MALFORMED)
        else:
            events = Publisher(client, "onceflow-events", publish_s, rate=10, first_closed=first_closed, seed=seed,
                               malformed=MALFORMED)
        orders = OrderPublisher(client, publish_s, rate=4, seed=seed)
        faults = FaultInjector(stack, pipelines, iterations, spacing_s=publish_s / max(iterations, 1), seed=seed,
                               events=events)
        for thread in (events, orders, faults):
            thread.start()
        _say(f"seed {seed}: publishing for {publish_s:.0f}s while {iterations} faults are injected")
        _settle(stack, pipelines, (events, orders, faults), settle_s)
        for thread in (events, orders, faults):
            if thread.error is not None:
                raise thread.error
        report = ChaosReport(seed, stack.engine_path, profile, source, faults.log.injected, events.expected.messages + orders.sent.messages)
        for note in faults.log.notes:
            print(f"  {note}", flush=True)
        _account(stack, pipelines, report, {
            "events": (events.expected.valid_ids, events.expected.malformed_ids),
            "orders": (orders.sent.valid_ids, orders.sent.malformed_ids),
        }, faults.extra)
        report.problems += _operator_views(pipelines)
        report.launches = Counter(run.tags.get(LAUNCHED_BY_TAG, "default") for run in stack.instance.get_runs())
        report.read_ahead = sum(_batches_read_ahead(stack.instance, pipeline) for pipeline in pipelines)
        if not report.launches["standby"]:
            report.problems.append("no run was launched in a standby process: the warm run launcher never ran")
    report.elapsed_s = time.monotonic() - started
    if report.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        report.problems.append(f"kept for inspection: {workdir}")
    return report


def _batches_read_ahead(instance: dg.DagsterInstance, pipeline) -> int:
    """How many of the pipeline's committed batches were read while the batch before them committed."""
    found = instance.fetch_materializations(raw_asset_key(pipeline), limit=10_000).records  # Dagster fetches at most that
    return sum(1 for r in found if r.asset_materialization and r.asset_materialization.metadata.get("read_ahead")
               and r.asset_materialization.metadata["read_ahead"].value)


def _settle(stack: LocalStack, pipelines: list, threads: tuple, timeout_s: float) -> None:
    """Wait until the traffic and the faults are over and everything is committed and published."""
    for thread in threads:
        thread.done.wait()
    _say("traffic and faults over; waiting for every window to close and publish")
    sources = [open_source(p, stack.lake, resources_for(load_settings())[PUBSUB].client) for p in pipelines]
    commits = CommitStore(stack.lake.commits())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stack.daemon.poll() is not None:
            raise RuntimeError(f"dagster-daemon exited:\n{stack.daemon_log()}")
        waiting = [s.pipeline.name for s in sources if s.reader.has_data(s.checkpoints.load())]
        busy = stack.instance.get_runs(filters=dg.RunsFilter(statuses=[
            dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]))
        unpublished = _unpublished(stack, pipelines, commits)
        if not waiting and not busy and not unpublished and not commits.unfinished():
            return
        _say(f"settling: messages waiting in {waiting or 'none'}, {len(busy)} runs, "
             f"{len(unpublished)} windows not published {unpublished[:4]}, "
             f"{len(commits.unfinished())} commit sequences pending")
        time.sleep(10)
    # What the window sensors hold: the next window, the pending ones with their attempts.
    cursors = [f"{state.name}: {state.instigator_data.cursor}" for state in stack.instance.all_instigator_state()
               if state.name.endswith("_window_sensor") and state.instigator_data is not None]
    raise TimeoutError(f"did not settle within {timeout_s:.0f}s: {unpublished}\n" + "\n".join(cursors))


def _unpublished(stack: LocalStack, pipelines: list, commits: CommitStore) -> list[str]:
    """Windows holding raw rows whose final pane is not published (closed, committed, sequence done), each with
    where it stopped."""
    missing = []
    for pipeline in pipelines:
        raw = stack.lake.table_path(pipeline.raw_table)
        try:
            times = {t for (t,) in read_rows(raw, ["event_time"])}
        except TableNotFoundError:  # nothing ingested yet: nothing to publish
            continue
        for output in pipeline.windowed_outputs:
            closes = CloseStore(stack.lake.panes(), output.asset)
            windows = {Window.at(int(t.timestamp() * 1000), output.window_s) for t in times}
            for window in sorted(windows, key=lambda w: w.start_ms):
                close = closes.latest(window)
                seq = close and sequence_id(output.asset, window.key, close.pane)
                if not seq:
                    missing.append(f"{output.asset} {window.key} (not closed)")
                elif commits.get(seq) is None:
                    missing.append(f"{output.asset} {window.key} (pane {close.pane} closed, no commit sequence)")
                elif (state := commits.state(seq)).status != DONE:
                    missing.append(f"{output.asset} {window.key} (pane {close.pane}: sequence {state.status}, "
                                   f"{state.quarantine_reason or state.last_error or ''})")
    return missing


def _account(stack: LocalStack, pipelines: list, report: ChaosReport, sent: dict, extra: dict[str, Extra]) -> None:
    """Compare the end state with what was sent (by the publishers, and by the faults themselves: `extra`), with
    independent readers."""
    spark = _accounting_session(stack.spark_remote)
    for pipeline in pipelines:
        more = extra.get(pipeline.name, Extra())
        valid, malformed = sent[pipeline.name][0] | more.valid, sent[pipeline.name][1] | more.malformed
        report.records += len(valid) + len(more.either)
        report.malformed += len(malformed)
        raw = [r[0] for r in read_rows(stack.lake.table_path(pipeline.raw_table), ["record_id"])]
        dead = [r[0] for r in read_rows(stack.lake.table_path(pipeline.dead_letter_table), ["record_id"])]
        held = set(raw) | set(dead)
        report.lost += sorted(f"{pipeline.name}:{i}" for i in (valid - set(raw)) | (malformed - set(dead))
                              | (more.either - held))
        report.duplicated += sorted(f"{pipeline.name}:{i}" for i, n in (Counter(raw) + Counter(dead)).items() if n > 1)
        report.problems += [f"{pipeline.name}: unexpected record {i}"
                            for i in (set(raw) - valid - more.either) | (set(dead) - malformed - more.either)]
        report.problems += _bigquery_differences(stack, pipeline)
        for check, held in audit_record_outputs(pipeline, stack.lake,
                                                reconcile_record_outputs(pipeline, stack.lake)).items():
            print(f"  [{'ok' if held else 'FAILED'}] {check}", flush=True)
            if not held:
                report.problems.append(f"{pipeline.name}: {check}")
        source, outputs = reconcile_pipeline(spark, pipeline, stack.lake)
        if not source.ok:
            report.problems.append(f"{pipeline.name}: reconciliation {source}")
        for asset, rows in outputs.items():
            print(f"{pipeline.name} {asset}\n{render(rows)}", flush=True)
            report.problems += [f"{asset} {r.window}: does not reconcile ({r})" for r in rows if not r.ok]


def _accounting_session(remote: str | None, attempts: int = 3) -> SparkSession:
    """The account's Spark session (a local one on the classic path). Its JVM once exited before it started, in CI
    at the end of a run that kept the machine busy: the account is the judge, not what is judged, so a start that
    fails is said and tried again."""
    for _ in range(attempts - 1):
        try:
            return build_spark_session(remote=remote)
        except PySparkRuntimeError as error:
            _say(f"the account's Spark session did not start ({error}); trying again in 10s")
            time.sleep(10)
    return build_spark_session(remote=remote)


def _operator_views(pipelines: list) -> list[str]:
    """What an operator runs afterwards says the same: `onceflow verify` holds for every pipeline, `onceflow
    status` shows no commit sequence pending or quarantined."""
    problems = []
    for command, expected in (
        ("verify", [f"{p.name}: exactly-once holds" for p in pipelines]),
        ("status", ["commit sequences: 0 pending, 0 quarantined"]),
    ):
        done = subprocess.run([sys.executable, "-m", "onceflow", command], capture_output=True, text=True,
                              timeout=300)
        missing = [line for line in expected if line not in done.stdout]
        if done.returncode != 0 or missing:
            problems.append(f"onceflow {command} exited {done.returncode}, without {missing}:\n{done.stdout[-3000:]}"
                            f"{done.stderr[-2000:]}")
    return problems


def _bigquery_differences(stack: LocalStack, pipeline) -> list[str]:
    """BigQuery (the emulator) holds, per output it is a sink of, exactly the window table's rows."""
    if stack.bigquery is None:
        return []
    client, problems = stack.bigquery.client(), []
    for output in pipeline.windowed_outputs:
        sink = next((s for s in output.sinks if isinstance(s, BigQuerySink)), None)
        if sink is None:
            continue
        table = f"{client.project}.{sink.dataset}.{sink.table}"
        published = sorted(canonical_row(dict(row.items())) for row in client.query_and_wait(f"SELECT * FROM `{table}`"))
        held = sorted(canonical_row(r) for r in delta_table(stack.lake.table_path(output.table)).to_pyarrow_table().to_pylist())
        if published != held:
            problems.append(f"{table}: BigQuery holds {len(published)} rows, the window table {len(held)}, or they differ")
    return problems


def _say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--publish-s", type=float, default=None)
    parser.add_argument("--engine", choices=("connect", "classic"), default="connect")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="local")
    parser.add_argument("--source", choices=("pubsub", "kafka"), default="pubsub", help="the events pipeline's")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    report = run_chaos(args.iterations, seed, publish_s=args.publish_s or max(60.0, 8.0 * args.iterations),
                       engine_path=args.engine, profile=args.profile, source=args.source)
    for problem in report.problems[:20]:
        print(f"  problem: {problem}")
    print(report.summary(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
