"""A started engine's warm-up batches: ingested exactly once in a process of their own, and nothing left behind."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.orchestration.warm_up import warm_engine
from onceflow.resources.spark_connect import SparkConnectServer


def scratch_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("onceflow-warm-up-*"))


def test_the_warm_up_ingests_its_batches_and_removes_its_scratch_home(
    spark: SparkSession, spark_connect: SparkConnectServer
) -> None:
    if hasattr(spark, "_jsparkSession"):
        pytest.skip("a classic session has no engine to warm")
    before = scratch_dirs()
    seconds = warm_engine(spark_connect.url, "local[2]")  # fails unless both batches inserted their 40 records
    assert seconds is not None and seconds > 0
    assert scratch_dirs() <= before
    # Executors on other machines could not read the scratch files: no warm-up there.
    assert warm_engine(spark_connect.url, "spark://spark-master.internal:7077") is None
