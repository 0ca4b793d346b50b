"""The functions batches are compiled with (`jobs/ingest/CompiledFunction.java`, in a classic session and in every
session of a Spark Connect server onceflow starts) give exactly what Spark's own give: `onceflow_json_record` reads
every record as `from_json` with the same schema and options (the same values, partial results and corrupt records),
`onceflow_utf8` takes every byte string `try_validate_utf8` takes, `onceflow_id_hash` hashes every record ID as the
driver's ID filters do; and Spark compiles them into the batch's stage. Such a server's driver also evaluates a
client's projection of a few rows as the job would (`ProjectionPlugin.java`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow.jobs.dedup.fingerprints import id_hash_sql, id_hashes
from onceflow.jobs.ingest.local_projection import evaluated_on_driver, on_driver
from onceflow.jobs.ingest.record_fields import OPTIONS
from onceflow.orchestration.local_stack import PROJECT_ROOT
from onceflow.resources.spark_functions import compiled_functions
from tests.conftest import require
from tests.spark_plans import parsed_plan

SCHEMA = ("a INT, d DECIMAL(38,30), t TIMESTAMP, s STRUCT<x: INT, y: ARRAY<DOUBLE>>, m MAP<STRING, INT>, "
          "b BOOLEAN, _corrupt STRING")
RECORDS = [
    '{"a": 1, "d": "1.5", "t": "2024-01-02T03:04:05Z", "s": {"x": 2, "y": [1.5, 2]}, "m": {"k": 1}, "b": true}',
    '\ufeff{"a": 1}', "\x00\x00\x00{\x00\x00\x00}", '{"a": 1} trailing', '{"a": 1, "a": 2}', '{"a": NaN}',
    '{"a": "x", "b": false}', '{"a": 1.5}', '{"d": 1e400}', '{"s": {"x": "bad"}, "a": 5}', '[{"a": 1}]', "5",
    '"text"', "null", "", "   ", '{"a": 1', "{'a': 1}", '{"a": 01}', '{"t": 1700000000}', '{"m": {"k": "v"}}',
    '{"a": 1}\n{"a": 2}', '{"é": "ü", "a": 2}', '{"a": 2147483648}', '{"t": "tomorrow", "a": 3}', "{}",
    '{"s": null, "m": {}}', '{"a": 1, "unknown": {"deep": [1, {"x": []}]}}',
]
# Byte strings (hex): ASCII, valid 2-, 3- and 4-byte sequences, and what UTF-8 refuses (a lone continuation byte,
# a cut sequence, an overlong form, a surrogate, a code point above U+10FFFF, bytes never used).
BYTES = ["", "7b7d", "c3a9", "e282ac", "f09f9880", "7bc3a97d", "80", "c3", "e282", "c0af", "eda080", "f4908080",
         "ff", "fe", "7b2261223a2280227d", "41" * 40 + "c3"]
# Record IDs of every length to 24 bytes (SipHash takes 8 at a time, the last word holds the rest and the length), in
# 1- to 4-byte UTF-8, long ones, and NULL.
IDS = ["", *("events/files:0123456789é€😀x"[:n] for n in range(1, 25)), "ünïcode-€-1", "0" * 64, "k" * 1000, None]
SCRIPT = """
import json
from onceflow.resources.spark import build_spark_session
from tests.test_compiled_functions import compare
spark = build_spark_session()
print(json.dumps(compare(spark, lambda df: df._jdf.queryExecution().executedPlan().toString())))
"""


def compare(spark: SparkSession, physical: Callable[[DataFrame], str]) -> dict[str, Any]:
    """The cases through onceflow's compiled functions and through Spark's own, in `spark`, with the physical plans
    (`physical`, as text) of the first."""
    assert compiled_functions(spark)
    rows = spark.createDataFrame(list(enumerate(RECORDS)), "i INT, p STRING")
    both = rows.selectExpr("i", f"to_json(onceflow_json_record(p, '{SCHEMA}', {OPTIONS})) AS ours",
                           f"to_json(from_json(p, '{SCHEMA}', {OPTIONS})) AS spark")
    # The plans over rows Spark cannot fold the projection into (a local relation, over Spark Connect).
    numbers = spark.range(2).selectExpr("CAST(id AS STRING) AS p", "CAST(CAST(id AS STRING) AS BINARY) AS b")
    plan = physical(numbers.selectExpr(f"onceflow_json_record(p, '{SCHEMA}', {OPTIONS}).a AS a"))
    data = spark.createDataFrame([(i, bytes.fromhex(h)) for i, h in enumerate(BYTES)], "i INT, b BINARY")
    texts = data.selectExpr("i", "onceflow_utf8(b) AS ours", "try_validate_utf8(CAST(b AS STRING)) AS spark")
    hashed = spark.createDataFrame(list(enumerate(IDS)), "i INT, record_id STRING").selectExpr("i", *id_hash_sql())
    return {"rows": [r.asDict() for r in both.orderBy("i").collect()], "plan": plan,
            "texts": [r.asDict() for r in texts.orderBy("i").collect()],
            "text_plan": physical(numbers.selectExpr("onceflow_utf8(b) AS t")),
            "hashes": [list(r)[1:] for r in hashed.orderBy("i").collect()],
            "hash_plan": physical(numbers.selectExpr(*id_hash_sql("p")))}


def test_a_classic_sessions_compiled_functions_give_what_spark_gives_and_are_compiled() -> None:
    """In a process of its own: a process holds one kind of session."""
    require(shutil.which("java") is not None, "Java 17")
    env = {k: v for k, v in os.environ.items() if k not in ("ONCEFLOW_SPARK_REMOTE", "SPARK_REMOTE",
                                                            "SPARK_CONNECT_MODE_ENABLED")}
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    _check(json.loads(run.stdout.strip().splitlines()[-1]))


def test_a_connect_server_onceflow_starts_compiles_batches_as_a_classic_session_does(spark: SparkSession) -> None:
    """A Spark Connect server onceflow starts has the functions in every session (`SessionFunctions.java`), which a
    client could not register: its batches are compiled as a classic session's are."""

    def physical(df: DataFrame) -> str:
        return df._explain_string().split("== Physical Plan ==\n", 1)[1]

    _check(compare(spark, physical))


def _check(out: dict[str, Any]) -> None:
    rows = out["rows"]
    assert [row["i"] for row in rows] == list(range(len(RECORDS)))
    assert [row["ours"] for row in rows] == [row["spark"] for row in rows]
    # The cases are not all alike: read, corrupt, partly read, and not read at all.
    assert sum(row["spark"] is not None and "_corrupt" in row["spark"] for row in rows) >= 10
    assert sum(row["spark"] is not None and "_corrupt" not in row["spark"] for row in rows) >= 8
    # One stage of generated code, with the reader inside it (`from_json` would stand in a stage of its own).
    assert out["plan"].startswith("*(1) Project [onceflow_json_record(cast(id"), out["plan"]
    texts = out["texts"]
    assert [row["i"] for row in texts] == list(range(len(BYTES)))
    assert [row["ours"] for row in texts] == [row["spark"] for row in texts]
    assert sum(row["spark"] is None for row in texts) == 10
    assert out["text_plan"].startswith("*(1) Project [onceflow_utf8(cast(cast(id"), out["text_plan"]
    prints = id_hashes(pa.array(IDS[:-1]))
    assert out["hashes"] == [[int(h) for h in pair] for pair in zip(prints.first.view(np.int64),
                                                                    prints.second.view(np.int64), strict=True)] \
        + [[None, None]]
    assert out["hash_plan"].startswith("*(1) Project [onceflow_id_hash("), out["hash_plan"]


def test_a_connect_servers_driver_projects_a_clients_rows_as_a_job_would(spark: SparkSession) -> None:
    """`evaluated_on_driver` gives the rows of the plain DataFrame. A projection of rows the client sends is
    evaluated on the server's driver (the server's plan is already the rows), its analysis kept for the next call
    with other rows; any other input (a projection of a projection, rows the server reads) is planned as Spark
    plans it."""
    parsed = F.expr("from_json(payload, 'a INT, b STRING')")
    columns = (parsed.getField("a").alias("a"), parsed.getField("b").alias("b"), F.length("payload").alias("n"),
               (F.col("at") + F.expr("INTERVAL 1 SECOND")).alias("later"), F.col("i"))
    for payloads in (['{"a": 1, "b": "x"}', '{"a": "no"}', "not json", None], ['{"b": "y"}', '{"a": 7}']):
        rows = pa.table({"payload": payloads, "at": pa.array([1_000_000] * len(payloads), pa.timestamp("us", "UTC")),
                         "i": pa.array(range(len(payloads)), pa.int64())})
        projected = spark.createDataFrame(rows).select(*columns)
        plain = projected.toArrow().to_pylist()
        assert len(plain) == len(payloads) and plain[0]["n"] == len(payloads[0])
        assert evaluated_on_driver(projected).to_pylist() == plain
        assert parsed_plan(on_driver(projected)).startswith("LocalRelation ["), parsed_plan(on_driver(projected))
        again = projected.select("a", "n")
        assert evaluated_on_driver(again).to_pylist() == again.toArrow().to_pylist()
        assert parsed_plan(on_driver(again)).startswith("'Project"), parsed_plan(on_driver(again))
    other = spark.range(5).selectExpr("id * 2 AS doubled")
    assert evaluated_on_driver(other)["doubled"].to_pylist() == [0, 2, 4, 6, 8]
    assert "Range (0, 5" in parsed_plan(on_driver(other)), parsed_plan(on_driver(other))


@pytest.mark.engine_paths
def test_a_sessions_fingerprints_are_checked_against_the_saved_filters_test_vector(spark: SparkSession) -> None:
    from onceflow.jobs.dedup import fingerprints

    # The JVM's hashes of the test vector are those saved filters record (`hash_test_vector`, pandas'): the
    # session hashes its batches' IDs in Spark only then.
    assert fingerprints.hashes_in_spark(spark)
    expected = fingerprints.hash_test_vector()
    rows = spark.createDataFrame(list(enumerate(fingerprints._TEST_VECTOR_IDS)), "i INT, record_id STRING") \
        .selectExpr("i", *fingerprints.id_hash_sql()).orderBy("i").collect()
    assert [int(h) % 2**64 for row in rows for h in list(row)[1:]] == expected
