"""The faults the chaos harness injects, each the real thing: a process killed at a named crash point, a SIGKILL
of a run's process tree at a random instant, two launches of one micro-batch at once, a backfill racing the
sensors, the Spark engine restarted under running work, the checkpoints replaced by an older copy of themselves,
a run killed inside a sink's transaction, a sink's database dropping its connections.

Direct launches (`dagster job execute`, `dagster asset materialize`) race the daemon's sensors on the same
instance, as an operator's would.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import dagster as dg

from onceflow.jobs.declare.bigquery_sink import BigQuerySink
from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.kafka_sink import KafkaSink
from onceflow.jobs.declare.postgres_sink import PostgresSink
from onceflow.jobs.windows.panes import CloseStore
from onceflow.orchestration.local_stack import PROJECT_ROOT, LocalStack
from onceflow.orchestration.sensors.runs import run_worker_pid
from onceflow.orchestration.workload import Publisher, Worker
from onceflow.resources.faults import CRASH_EXIT_CODE, POINTS
from onceflow.resources.processes import kill_tree
from tests.chaos.operator_faults import OperatorFaults

KINDS = ("crash_point", "sigkill", "double_launch", "backfill", "engine_restart", "checkpoint_rollback",
         "first_second", "declaration_change", "topic_recreated", "transaction_open", "malformed_partition",
         "sink_crash", "sink_connections_dropped")
WEIGHTS = (5, 4, 2, 2, 1, 1, 2, 1, 1, 1, 1, 2, 1)
KAFKA_ONLY = frozenset({"topic_recreated", "transaction_open", "malformed_partition"})
DAGSTER = [sys.executable, "-m", "dagster"]
LOCATION = ["-m", "onceflow.orchestration.definitions"]


@dataclass
class FaultLog:
    injected: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def note(self, kind: str, what: str) -> None:
        self.injected[kind] += 1
        self.notes.append(f"{time.strftime('%H:%M:%S')} {kind}: {what}")


class FaultInjector(OperatorFaults, Worker):
    """Injects `count` faults, one every `spacing_s` seconds or so, chosen by a seeded random generator. Each
    counts only when it really happened (a crash point reached, a process killed); a kind that cannot happen yet
    (no closed window to backfill) is passed over for another. `events` is the events publisher (held while its
    topic is re-created); `extra` what the faults sent themselves (`tests.chaos.operator_faults.Extra`)."""

    def __init__(self, stack: LocalStack, pipelines: list[Pipeline], count: int, spacing_s: float, seed: int,
                 events: Publisher | None = None):
        super().__init__()
        self.stack, self.pipelines, self.count, self.spacing_s = stack, pipelines, count, spacing_s
        self.rng = random.Random(seed)
        self.log = FaultLog()
        self.events, self.extra = events, {}

    def work(self) -> None:
        injected = 0
        # On the classic path there is no shared engine to restart: each run's own session dies with its process.
        kinds = [(k, w) for k, w in zip(KINDS, WEIGHTS, strict=True)
                 if (k != "engine_restart" or self.stack.engine_path == "connect")
                 and (k not in KAFKA_ONLY or self.stack.kafka is not None)]
        while injected < self.count:
            time.sleep(self.rng.uniform(0.5, 1.5) * self.spacing_s)
            kind = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            injected += bool(getattr(self, kind)())

    def _pipeline(self) -> Pipeline:
        return self.rng.choice(self.pipelines)

    def crash_point(self) -> bool:
        """A direct launch with a random crash point armed; True once a process really died at it."""
        for _ in range(3):
            point, pipeline = self.rng.choice(sorted(p for p in POINTS if not p.startswith("sink."))), self._pipeline()
            if point.startswith(("window.", "commit.")):
                output = self.rng.choice(pipeline.windowed_outputs)
                closed = CloseStore(self.stack.lake.panes(), output.asset).windows(output.window_s)
                if not closed:
                    continue
                # The window after the last closed one: when it is due, this run closes and publishes it.
                args = ["asset", "materialize", *LOCATION, "--select", output.asset, "--partition",
                        closed[-1].next().key]
            else:
                args = ["job", "execute", *LOCATION, "-j", f"ingest_{pipeline.name}"]
            if point == "commit.after_step":
                point += f"#{self.rng.randint(1, 3)}"
            run = subprocess.run([*DAGSTER, *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                                 env={**_env(), "ONCEFLOW_CRASH_AT": point})
            if run.returncode == CRASH_EXIT_CODE:
                self.log.note("crash_point", f"{point} in `dagster {' '.join(args[:2])}` of {pipeline.name}")
                return True
        return False

    def sink_crash(self) -> bool:
        """A micro-batch of a pipeline with a record output killed inside a sink's commit (its rows written, the
        transaction not committed); True once a process really died there."""
        sinks = {"sink.postgres.before_commit": PostgresSink, "sink.kafka.before_commit": KafkaSink,
                 "sink.bigquery.before_commit": BigQuerySink}
        choices = [(point, p) for p in self.pipelines for point, kind in sinks.items()
                   if any(isinstance(s, kind) for o in p.record_outputs for s in o.sinks)]
        if not choices:
            return False
        point, pipeline = self.rng.choice(choices)
        args = ["job", "execute", *LOCATION, "-j", f"ingest_{pipeline.name}"]
        run = subprocess.run([*DAGSTER, *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                             env={**_env(), "ONCEFLOW_CRASH_AT": point})
        if run.returncode != CRASH_EXIT_CODE:
            return False  # no new batch to publish: nothing reached the sink
        self.log.note("sink_crash", f"{point} in `dagster job execute` of {pipeline.name}")
        return True

    def sink_connections_dropped(self) -> bool:
        """PostgreSQL drops every connection of the record output's sink, as a restart does: the publications
        under way fail, as unreachable, and are finished by later attempts."""
        if self.stack.postgres is None or not any(p.record_outputs for p in self.pipelines):
            return False
        import psycopg

        with psycopg.connect(self.stack.postgres.dsn, autocommit=True) as admin:
            dropped = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                                    "application_name = 'onceflow-sink'").fetchone()
        self.log.note("sink_connections_dropped", f"{dropped[0] if dropped else 0} PostgreSQL connections dropped")
        return True

    def sigkill(self) -> bool:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            runs = self.stack.instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
            for run in runs:
                worker = run_worker_pid(self.stack.instance, run.run_id)
                if worker is not None:
                    time.sleep(self.rng.uniform(0, 2))
                    killed = kill_tree(worker)
                    if killed:
                        self.log.note("sigkill", f"run {run.run_id[:8]} ({run.job_name}), {len(killed)} processes")
                        return True
            time.sleep(0.5)
        return False

    def double_launch(self) -> bool:
        pipeline = self._pipeline()
        command = [*DAGSTER, "job", "execute", *LOCATION, "-j", f"ingest_{pipeline.name}"]
        both = [subprocess.Popen(command, cwd=PROJECT_ROOT, env=_env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for _ in range(2)]
        codes = [p.wait(timeout=300) for p in both]
        self.log.note("double_launch", f"two `ingest_{pipeline.name}` at once: exits {codes}")
        return True

    def backfill(self) -> bool:
        pipeline = self._pipeline()
        output = self.rng.choice(pipeline.windowed_outputs)
        windows = CloseStore(self.stack.lake.panes(), output.asset).windows(output.window_s)
        if len(windows) < 2:
            return False
        first, last = windows[0].key, windows[-1].key
        run = subprocess.run([*DAGSTER, "asset", "materialize", *LOCATION, "--select", output.asset,
                              "--partition-range", f"{first}...{last}"], cwd=PROJECT_ROOT, env=_env(),
                             capture_output=True, text=True, timeout=300)
        self.log.note("backfill", f"{output.asset} {first}...{last}: exit {run.returncode}")
        return True

    def engine_restart(self) -> bool:
        self.stack.restart_engine()
        self.log.note("engine_restart", "Spark Connect engine stopped and started again")
        return True

    def checkpoint_rollback(self) -> bool:
        """The checkpoints replaced by a copy of themselves taken seconds before, through the store they live in
        (local disk or `gs://`), as an operator restoring a backup would."""
        checkpoints = self.stack.lake.checkpoints()
        copy = {key: checkpoints.read(key) for key in checkpoints.list("")}
        if not copy:
            return False
        time.sleep(self.rng.uniform(5, 15))  # batches go on committing meanwhile
        for key in checkpoints.list(""):
            checkpoints.delete(key)
        for key, data in copy.items():
            if data is not None:
                checkpoints.write(key, data)
        self.log.note("checkpoint_rollback", "checkpoints replaced by a copy taken seconds before")
        return True


    def _dagster(self, args: list[str]) -> list[str]:
        return [*DAGSTER, *args]

    def _onceflow(self, args: list[str]) -> list[str]:
        return [sys.executable, "-m", "onceflow", *args]

    def _dagster_env(self) -> dict[str, str]:
        return _env()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for inherited in ("ONCEFLOW_CRASH_AT", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        env.pop(inherited, None)
    return env

