"""Shared fixtures: one Spark session for the whole run, Google's Pub/Sub emulator, a fresh onceflow home."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from resources.pubsub_emulator import PubSubEmulator, start_pubsub_emulator
from resources.spark import build_spark_session

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(condition: bool, what: str) -> None:
    """Skip locally when a dependency is missing; under CI=true a missing dependency fails the run."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true", pytrace=False)
    pytest.skip(f"{what} is not available")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    require(shutil.which("java") is not None, "Java 17")
    warehouse = tmp_path_factory.mktemp("warehouse")
    session = build_spark_session(
        master="local[2]",
        app_name="onceflow-tests",
        conf={"spark.sql.warehouse.dir": str(warehouse), "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[PubSubEmulator]:
    require(shutil.which("gcloud") is not None, "the Google Cloud CLI's Pub/Sub emulator")
    emulator = start_pubsub_emulator()
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
    yield emulator
    emulator.stop()
    if previous is None:
        os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
        os.environ["PUBSUB_EMULATOR_HOST"] = previous


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh `$ONCEFLOW_HOME` for one test."""
    path = tmp_path / "onceflow"
    path.mkdir()
    monkeypatch.setenv("ONCEFLOW_HOME", str(path))
    return path
