"""onceflow's own Spark functions: compiled once into a cached jar, named by what it was built from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import weakref
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.dedup.first_records import without_ordinals
from onceflow.jobs.ingest.batch_read import BatchRead
from onceflow.orchestration.local_stack import PROJECT_ROOT
from onceflow.resources import spark_functions
from onceflow.resources.spark_functions import (
    JavaCompilerMissingError,
    SparkFunctionsMissingError,
    ensure_spark_functions_jar,
    register_spark_functions,
)
from tests.conftest import require


def test_the_jar_is_built_once_and_rebuilt_when_a_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = ensure_spark_functions_jar(tmp_path)

    assert {"io/onceflow/LineOffsets.class", "io/onceflow/NotAmong.class", "io/onceflow/LocalProjection.class",
            "io/onceflow/Py4JNoDelay.class"} <= set(zipfile.ZipFile(jar).namelist())
    built_at = jar.stat().st_mtime_ns
    assert ensure_spark_functions_jar(tmp_path) == jar and jar.stat().st_mtime_ns == built_at
    assert [p.name for p in (tmp_path / "onceflow").iterdir()] == [jar.name]  # no work files left behind

    sources = tmp_path / "jobs"
    for source in spark_functions.SOURCES.glob("*/*.java"):
        changed = sources / source.relative_to(spark_functions.SOURCES)
        changed.parent.mkdir(parents=True, exist_ok=True)
        changed.write_text(source.read_text() + "\n// changed\n")
    monkeypatch.setattr(spark_functions, "SOURCES", sources)
    rebuilt = ensure_spark_functions_jar(tmp_path)
    assert rebuilt != jar and rebuilt.exists()


def test_a_machine_without_javac_gets_an_error_that_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jre-only"))
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(JavaCompilerMissingError, match="install a JDK 17"):
        ensure_spark_functions_jar(tmp_path / "cache")


def test_a_classic_session_sends_py4j_replies_without_waiting_for_an_ack() -> None:
    """Nagle's algorithm is off on every Py4J connection of a classic session's JVM (`Py4JNoDelay`) once a process
    gets its session (`build_spark_session`, as a run does): nothing is left to turn off after it (a JVM that hid
    the connections would say -1). In a process of its own: a process holds one kind of session."""
    require(shutil.which("java") is not None, "Java 17")
    script = ("from onceflow.resources.spark import build_spark_session\n"
              "print(build_spark_session()._jvm.io.onceflow.Py4JNoDelay.apply())")
    env = {k: v for k, v in os.environ.items() if k not in ("ONCEFLOW_SPARK_REMOTE", "SPARK_REMOTE",
                                                            "SPARK_CONNECT_MODE_ENABLED")}
    run = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "0", run.stdout[-2000:]  # after the JVM's own log lines


def test_without_ordinals_drops_exactly_the_rows_at_those_ordinals(spark: SparkSession) -> None:
    register_spark_functions(spark)
    ordinals = [-(2**63), -5, 0, 1, 7, 8, 2**40, 2**63 - 1]
    rows = spark.createDataFrame([(o, f"r{o}") for o in ordinals], "ordinal BIGINT, name STRING")

    def kept(excluded: list[int]) -> list[str]:
        return sorted(r["name"] for r in without_ordinals(rows, np.array(excluded, np.int64)).collect())

    assert without_ordinals(rows, np.array([], np.int64)).columns == ["name"]
    assert kept([]) == sorted(f"r{o}" for o in ordinals)
    # Unsorted, repeated, and absent values; the first, middle and last members of the sorted set.
    assert kept([8, -(2**63), 3, 8, 2**63 - 1, 0]) == sorted(["r-5", "r1", "r7", f"r{2**40}"])
    assert kept(ordinals) == []


def test_an_engine_without_the_jar_gets_an_error_naming_the_fix(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(spark_functions.SQL_FUNCTIONS, "onceflow_absent", ("io.onceflow.Absent", T.BooleanType()))
    monkeypatch.setattr(spark_functions, "_REGISTERED", weakref.WeakSet())  # a session not yet asked

    with pytest.raises(SparkFunctionsMissingError, match=r"cannot load io\.onceflow\.Absent.*onceflow setup"):
        register_spark_functions(spark)


def test_a_batch_read_drops_the_same_valid_records_held_here_or_in_spark(spark: SparkSession) -> None:
    """`BatchRead.valid`: the mask over a batch's valid records drops the same rows whether its records came to the
    driver (row for row with the slim columns, dead letters among them) or stay a DataFrame of its valid ones."""
    register_spark_functions(spark)
    reasons = [None, "malformed_json", None, None, "missing_field", None, None]
    ordinals = [10, 11, 2**40, 3, 4, 2**41 + 5, 6]
    slim = pa.table({"reason": pa.array(reasons, pa.string()), "ordinal": pa.array(ordinals, pa.int64())})
    records = pa.table({"name": [f"r{o}" for o in ordinals], "ordinal": pa.array(ordinals, pa.int64())})
    valid_rows = [(o, f"r{o}") for o, r in zip(ordinals, reasons, strict=True) if r is None]
    contract = RecordContract(T.StructType([T.StructField("name", T.StringType())]), 1024, 0)
    in_spark = BatchRead(slim, spark.createDataFrame(valid_rows, "ordinal BIGINT, name STRING"), len(ordinals), contract)
    here = BatchRead(slim, records, len(ordinals), contract)
    # Of the five valid records (r10 r1099511627776 r3 r2199023255557 r6), drop the second and the last.
    dropped = np.array([False, True, False, False, True])
    assert here.valid(dropped).to_pylist() == [{"name": "r10"}, {"name": "r3"}, {"name": f"r{2**41 + 5}"}]
    assert sorted(r["name"] for r in in_spark.valid(dropped).collect()) == sorted(["r10", "r3", f"r{2**41 + 5}"])
    assert here.valid()["name"].to_pylist() == [name for _, name in valid_rows]
    assert sorted(r["name"] for r in in_spark.valid().collect()) == sorted(name for _, name in valid_rows)
    assert slim.num_rows == 7 and records.num_rows == 7  # nothing filtered in place
