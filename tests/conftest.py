"""Shared fixtures: one Spark session for the whole run, Google's Pub/Sub emulator, a Kafka broker, a fresh
onceflow home.

The engine path a run proves is `ONCEFLOW_TEST_ENGINE`: `connect` (the default: a warm Spark Connect server that
this process and every process a test starts connect to) or `classic` (this process builds a local classic
session, where Delta's writer writes an append's files and delta-rs commits them). One process cannot hold both
(PySpark picks a session kind per process), so `make test` runs the suite on Connect and then the tests marked
`engine_paths` again on the classic path.

Run in parallel (pytest-xdist), the Connect pass shares one Spark Connect server between its workers, as the runs of a
deployment share one engine: the controller starts it before the workers and stops it after them. One warm JVM,
where a server per worker compiled the same Spark code twice on two cores.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from google.cloud import bigquery
from pyspark.sql import SparkSession

from onceflow.resources.emulators.bigquery import (
    BigQueryEmulator,
    BigQueryEmulatorUnavailable,
    start_bigquery_emulator,
)
from onceflow.resources.emulators.gcs import GcsEmulator, start_gcs_emulator
from onceflow.resources.emulators.kafka import KafkaBroker, start_kafka_broker
from onceflow.resources.emulators.pubsub import PubSubEmulator, start_pubsub_emulator
from onceflow.resources.maven_jars import MavenMissingError
from onceflow.resources.spark import build_spark_session
from onceflow.resources.spark_cluster import SparkCluster, start_spark_cluster
from onceflow.resources.spark_connect import SparkConnectServer, start_spark_connect_server

S = TypeVar("S", PubSubEmulator, SparkConnectServer, BigQueryEmulator, GcsEmulator)
IN_CI = os.environ.get("CI", "").lower() == "true"
ENGINE = os.environ.get("ONCEFLOW_TEST_ENGINE", "connect")
if ENGINE not in ("connect", "classic"):
    raise ValueError(f"ONCEFLOW_TEST_ENGINE={ENGINE!r}: expected connect or classic")


SHARED_ENGINE = "ONCEFLOW_TEST_SHARED_SPARK_REMOTE"
_shared_engine = pytest.StashKey[SparkConnectServer]()


@dataclass(frozen=True)
class SharedEngine:
    """The Spark Connect server the xdist controller started for every worker (see the module docstring)."""

    url: str

    def alive(self) -> bool:
        host, port = self.url.removeprefix("sc://").rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except OSError:
            return False
        return True


def pytest_configure(config: pytest.Config) -> None:
    is_controller = not hasattr(config, "workerinput")
    if ENGINE == "connect" and is_controller and config.getoption("numprocesses", None) and shutil.which("java"):
        config.stash[_shared_engine] = server = start_spark_connect_server()
        os.environ[SHARED_ENGINE] = server.url  # the workers, started after this, inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_shared_engine, None)
    if server is not None:
        server.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: a worker that draws one late would run on alone while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


def require(condition: bool, what: str) -> None:
    """Skip locally when a dependency is missing; under CI=true a missing dependency fails the run."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true", pytrace=False)
    pytest.skip(f"{what} is not available")


def running(service: S, variable: str, value: str) -> Iterator[S]:
    """Yield a started service with `variable` pointing at it; stop it at the end whatever happens."""
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(variable, value)
            yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def spark_connect() -> Iterator[SparkConnectServer | SharedEngine]:
    """One warm Spark engine for the whole run: this process and every process a test starts connect to it."""
    require(shutil.which("java") is not None, "Java 17")
    if shared := os.environ.get(SHARED_ENGINE):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("ONCEFLOW_SPARK_REMOTE", shared)
            yield SharedEngine(shared)
        return
    server = start_spark_connect_server()
    yield from running(server, "ONCEFLOW_SPARK_REMOTE", server.url)


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """A Spark standalone cluster on 127.0.0.1: a master and two workers of one core and 1 GB each."""
    require(shutil.which("java") is not None, "Java 17")
    cluster = start_spark_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def engine_path() -> str:
    """The engine path this run proves: `connect` or `classic` (see the module docstring)."""
    return ENGINE


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest, engine_path: str) -> Iterator[SparkSession]:
    if engine_path == "classic":
        require(shutil.which("java") is not None, "Java 17")
        with pytest.MonkeyPatch.context() as env:
            for variable in ("ONCEFLOW_SPARK_REMOTE", "SPARK_REMOTE"):  # processes a test starts are classic too
                env.delenv(variable, raising=False)
            session = build_spark_session()
            yield session
            session.stop()
        return
    spark_connect: SparkConnectServer | SharedEngine = request.getfixturevalue("spark_connect")
    session = build_spark_session(remote=spark_connect.url)
    yield session
    alive = spark_connect.alive() if isinstance(spark_connect, SharedEngine) else spark_connect.process.poll() is None
    if alive:  # a client of a dead server retries its goodbye for minutes
        session.stop()


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[PubSubEmulator]:
    require(shutil.which("gcloud") is not None, "the Google Cloud CLI's Pub/Sub emulator")
    emulator = start_pubsub_emulator()
    yield from running(emulator, "PUBSUB_EMULATOR_HOST", emulator.host)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Apache Kafka broker in KRaft mode on 127.0.0.1 (its jars from Maven Central, cached by `onceflow
    setup`); tests share it, each on topics of its own."""
    require(shutil.which("java") is not None, "Java 17")
    try:
        broker = start_kafka_broker(tmp_path_factory.mktemp("kafka"))
    except MavenMissingError as missing:  # its jars are not cached and cannot be resolved here
        require(False, str(missing))
        raise
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """The GCS emulator (fake-gcs-server behind the XML API shim delta-rs needs), named by STORAGE_EMULATOR_HOST."""
    emulator = start_gcs_emulator()
    yield from running(emulator, "STORAGE_EMULATOR_HOST", emulator.host)


@pytest.fixture(scope="session")
def bigquery_emulator() -> Iterator[BigQueryEmulator]:
    """The local BigQuery emulator (its own Python 3.13 venv, set up on first use)."""
    try:
        emulator = start_bigquery_emulator()
    except BigQueryEmulatorUnavailable as missing:
        require(False, str(missing))
        raise
    yield from running(emulator, "BIGQUERY_EMULATOR_HOST", emulator.endpoint)


@pytest.fixture(scope="session")
def bigquery_client(bigquery_emulator: BigQueryEmulator) -> Iterator[bigquery.Client]:
    client = bigquery_emulator.client()
    yield client
    client.close()


@pytest.fixture
def user_package() -> Iterator[str]:
    """The name of a user's package, `my_project`, that a test writes and imports: forgotten before and after,
    since Python keeps an imported package for the whole process and a later test in it would get this one."""

    def forget() -> None:
        for name in [n for n in sys.modules if n == "my_project" or n.startswith("my_project.")]:
            del sys.modules[name]

    forget()
    yield "my_project"
    forget()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh `$ONCEFLOW_HOME` for one test."""
    path = tmp_path / "onceflow"
    path.mkdir()
    monkeypatch.setenv("ONCEFLOW_HOME", str(path))
    return path
