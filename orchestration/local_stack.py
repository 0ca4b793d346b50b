"""A whole onceflow installation on this machine, for the demo and the chaos harness: Google's Pub/Sub emulator,
a Kafka broker (`kafka=True`), the lake on local disk or (`lake="gcs"`) on the GCS emulator, a warm Spark Connect
engine (or, on the classic engine path, none: every run builds its own Spark session, whose appends delta-rs
commits), optionally a Spark
standalone cluster that engine or those sessions drive (`spark="cluster"`: a master and two workers; `local`, the
default, keeps Spark in the driver), the BigQuery emulator (when it can be set up), a temporary Dagster instance
with the project's `dagster.yaml` (or, with `dagster_storage="postgres"`, the production `deploy/dagster.prod.yaml`
on a PostgreSQL server the stack starts), and a real `dagster-daemon` running the sensors and launching their runs.

Everything binds to 127.0.0.1; everything is stopped (process groups, children included) when the block ends.
The process environment is the stack's while the block runs, so code in the block (and every process it starts)
sees the same settings.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from onceflow.jobs.declare.sources import KafkaSource
from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.checkout import PROJECT_ROOT
from onceflow.orchestration.deployments import LAKE, PUBSUB, resources_for
from onceflow.orchestration.instance import INSTANCE_CONFIGS, write_instance, write_workspace
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.warm_up import warm_engine
from onceflow.resources.emulators.bigquery import (
    BigQueryEmulator,
    BigQueryEmulatorUnavailable,
    start_bigquery_emulator,
)
from onceflow.resources.emulators.gcs import start_gcs_emulator
from onceflow.resources.emulators.kafka import KafkaBroker, start_kafka_broker
from onceflow.resources.emulators.postgres import PostgresServer, start_postgres
from onceflow.resources.emulators.pubsub import PubSubEmulator, start_pubsub_emulator
from onceflow.resources.lake import LakeResource
from onceflow.resources.processes import stop_process_group
from onceflow.resources.settings import load_settings
from onceflow.resources.spark import build_spark_session
from onceflow.resources.spark_cluster import SparkCluster, start_spark_cluster
from onceflow.resources.spark_connect import SparkConnectServer, start_engine

# Deployment profiles (DESIGN §11): the Spark, the lake and Dagster's storage a stack runs on.
PROFILES: dict[str, dict[str, str]] = {
    "local": {"spark": "local", "lake": "local", "dagster_storage": "sqlite"},
    "cluster-gcs": {"spark": "cluster", "lake": "gcs", "dagster_storage": "postgres"},
}


@dataclass
class LocalStack:
    workdir: Path
    instance: dg.DagsterInstance
    pubsub: PubSubEmulator
    spark_remote: str | None  # None on the classic engine path
    engines: list[SparkConnectServer]  # the engine it started, if any, as a list so a restart can replace it
    bigquery: BigQueryEmulator | None
    daemon: subprocess.Popen[bytes]
    lake_home: str  # `ONCEFLOW_HOME`: `<workdir>/home`, or `gs://<bucket>/home` on the GCS emulator
    postgres: PostgresServer | None = None  # Dagster's storage (dagster_storage="postgres"), the records' sink
    cluster: SparkCluster | None = None  # with spark="cluster": the engine's (or every run's) master
    kafka: KafkaBroker | None = None  # with kafka=True: `ONCEFLOW_KAFKA_BOOTSTRAP` names it

    @property
    def home(self) -> Path | str:
        """The stack's `ONCEFLOW_HOME`: a local directory, or the `gs://` URL of a lake on the GCS emulator."""
        return self.lake_home if self.lake_home.startswith("gs://") else Path(self.lake_home)

    @property
    def engine_path(self) -> str:
        """`connect` (every process a client of one warm engine) or `classic` (a local session per process)."""
        return "classic" if self.spark_remote is None else "connect"

    @property
    def lake(self) -> LakeResource:
        return LakeResource(home=self.lake_home)

    def restart_engine(self) -> None:
        """Stop the Spark engine and start a new one on the same port: runs using it fail, and are retried."""
        if not self.engines:
            raise RuntimeError("this stack uses an engine it did not start")
        port = self.engines[0].port
        self.engines[0].stop()
        self.engines[0] = start_engine(load_settings(), port=port)  # on the stack's master, cluster or local
        warm_engine(self.engines[0].url, load_settings().spark_master)

    def daemon_log(self, chars: int = 3000) -> str:
        return (self.workdir / "daemon.log").read_text(errors="replace")[-chars:]


@contextmanager
def local_stack(
    settings: dict[str, str],
    prefix: str,
    spark_remote: str | None = None,
    keep: bool = False,
    say: Callable[[str], None] = print,
    engine_path: str = "connect",
    spark: str = "local",
    dagster_storage: str = "sqlite",
    lake: str = "local",
    kafka: bool = False,
    records: tuple[str, ...] = (),
) -> Iterator[LocalStack]:
    """Start the stack with `settings` (`ONCEFLOW_*` variables) on top of a clean environment; see the module
    docstring. `spark_remote` is an engine to use instead of starting one (Connect path); `engine_path="classic"`
    starts none; `spark="cluster"` starts a standalone cluster as the master of the engine (Connect path) or of
    every run's session (classic path, `ONCEFLOW_SPARK_MASTER`); `dagster_storage` is `sqlite` or `postgres`;
    `lake="gcs"` puts the whole home on the GCS emulator (`gs://<bucket>/home`, `STORAGE_EMULATOR_HOST` set for
    every process); `kafka=True` starts a KRaft broker (`ONCEFLOW_KAFKA_BOOTSTRAP`), on which a Kafka source's
    topic is made with three partitions; `records` are the sinks of `events`' record output `events_clean`
    (`ONCEFLOW_EVENTS_RECORDS`: `postgres` on a PostgreSQL the stack starts, `kafka` on its broker); `keep` keeps
    the working directory."""
    if engine_path not in ("connect", "classic"):
        raise ValueError(f"engine_path={engine_path!r}: expected connect or classic")
    if spark not in ("local", "cluster"):
        raise ValueError(f"spark={spark!r}: expected local or cluster")
    if dagster_storage not in INSTANCE_CONFIGS:
        raise ValueError(f"dagster_storage={dagster_storage!r}: expected {' or '.join(INSTANCE_CONFIGS)}")
    if lake not in ("local", "gcs"):
        raise ValueError(f"lake={lake!r}: expected local or gcs")
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ONCEFLOW_", "SPARK_", "PUBSUB_", "BIGQUERY_", "DAGSTER_PG_", "STORAGE_EMULATOR_"))}
    env.update(settings, ONCEFLOW_HOME=str(workdir / "home"), DAGSTER_HOME=str(workdir / "dagster"))
    write_instance(Path(env["DAGSTER_HOME"]), dagster_storage)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    stops: list[Callable[[], None]] = []
    # A SIGTERM (a CI timeout, `kill`) unwinds the block like an exception, so the servers are stopped too.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if lake == "gcs":
            say("starting the GCS emulator: the whole home on gs://")
            gcs = start_gcs_emulator()
            stops.append(gcs.stop)
            gcs.create_bucket("onceflow-lake")
            os.environ.update(STORAGE_EMULATOR_HOST=gcs.host, ONCEFLOW_HOME="gs://onceflow-lake/home")
        postgres = None
        if dagster_storage == "postgres" or "postgres" in records:
            say("starting PostgreSQL (Dagster's runs, events and schedules; the record output's sink)")
            postgres = start_postgres()
            stops.append(postgres.stop)
            if dagster_storage == "postgres":
                os.environ.update(postgres.env())  # what the production dagster.yaml reads its connection from
            if "postgres" in records:
                os.environ["ONCEFLOW_EVENTS_POSTGRES_DSN"] = postgres.dsn
        if records:
            os.environ["ONCEFLOW_EVENTS_RECORDS"] = ",".join(records)
        say(f"starting the Pub/Sub emulator, the BigQuery emulator and the Spark engine path: {engine_path}")
        pubsub = start_pubsub_emulator()
        stops.append(pubsub.stop)
        os.environ["PUBSUB_EMULATOR_HOST"] = pubsub.host
        cluster = None
        if spark == "cluster":
            say("starting a Spark standalone cluster: a master and two workers")
            cluster = start_spark_cluster()
            stops.append(cluster.stop)
            # Every driver (the engine, or each run's session) binds to loopback, as the cluster does.
            os.environ.update(ONCEFLOW_SPARK_MASTER=cluster.master_url, SPARK_LOCAL_IP="127.0.0.1")
            if engine_path == "classic":  # every run is an application of its own: one core each, two side by side
                os.environ.setdefault("ONCEFLOW_SPARK_CONF", '{"spark.cores.max": "1"}')
        engines: list[SparkConnectServer] = []
        if engine_path == "classic":
            spark_remote = None
        elif spark_remote is None:
            engines.append(start_engine(load_settings()))
            spark_remote = engines[0].url
            stops.append(lambda: engines[0].stop())
            warmed = warm_engine(spark_remote, load_settings().spark_master)
            if warmed is not None:
                say(f"the Spark engine ran its warm-up batches in {warmed:.1f} s")
            # Released while its engine is up: at exit, a client whose server is gone retries for ten minutes.
            stops.append(build_spark_session(remote=spark_remote).stop)
        if spark_remote is not None:
            os.environ["ONCEFLOW_SPARK_REMOTE"] = spark_remote
        broker = None
        if kafka:
            say("starting a Kafka broker (KRaft)")
            broker = start_kafka_broker()
            stops.append(broker.stop)
            os.environ["ONCEFLOW_KAFKA_BOOTSTRAP"] = broker.bootstrap
        bigquery = _bigquery(settings, say)
        if bigquery is not None:
            stops.append(bigquery.stop)
        resources = resources_for(load_settings())
        for pipeline in load_pipelines(load_settings()):
            if broker is not None and isinstance(pipeline.source, KafkaSource):
                broker.create_topic(pipeline.source.topic, partitions=3)  # more than one partition to order
            open_source(pipeline, resources[LAKE], resources[PUBSUB].client).reader.ensure()
        # The instance's storages are made now: two processes making them at once race on their tables.
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)
        instance.all_instigator_state()
        say("starting dagster-daemon: it runs the sensors and launches their runs")
        with (workdir / "daemon.log").open("w") as log:
            daemon = subprocess.Popen(
                [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w",
                 str(write_workspace(workdir / "workspace.yaml", working_directory=PROJECT_ROOT))],
                # From the checkout: its test pipelines (`ONCEFLOW_PIPELINES=tests....`) import from here.
                cwd=PROJECT_ROOT, env=dict(os.environ), start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
            )
        stops.append(lambda: stop_process_group(daemon, (signal.SIGTERM, signal.SIGKILL), timeout_s=20))
        yield LocalStack(workdir, instance, pubsub, spark_remote, engines, bigquery, daemon,
                         os.environ["ONCEFLOW_HOME"], postgres, cluster, broker)
    finally:
        for stop in reversed(stops):
            stop()
        os.environ.clear()
        os.environ.update(saved)
        signal.signal(signal.SIGTERM, previous)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _bigquery(settings: dict[str, str], say: Callable[[str], None]) -> BigQueryEmulator | None:
    """The BigQuery emulator with the settings' dataset, when the settings name one and it can be set up."""
    dataset = settings.get("ONCEFLOW_BIGQUERY_DATASET")
    if not dataset:
        return None
    project = settings.get("ONCEFLOW_BIGQUERY_PROJECT", "onceflow-local")
    try:
        bigquery = start_bigquery_emulator(project=project)
    except BigQueryEmulatorUnavailable as missing:
        os.environ.pop("ONCEFLOW_BIGQUERY_DATASET")
        say(f"BigQuery emulator unavailable ({missing}); publishing to files only")
        return None
    os.environ["BIGQUERY_EMULATOR_HOST"] = bigquery.endpoint
    os.environ["ONCEFLOW_BIGQUERY_PROJECT"] = project
    bigquery.client().create_dataset(dataset, exists_ok=True)
    return bigquery
