"""`onceflow_json_record` (`jobs/ingest/JsonRecord.java`), the JSON reader a classic session's batches are compiled
with, reads every record exactly as Spark's `from_json` with the same schema and options: the same values, the
same partial results, the same corrupt records; and Spark compiles it into the batch's stage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from onceflow.orchestration.local_stack import PROJECT_ROOT
from tests.conftest import require

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
SCRIPT = """
import json, sys
from onceflow.jobs.ingest.record_fields import OPTIONS
from onceflow.resources.spark import build_spark_session
from onceflow.resources.spark_functions import register_spark_functions
schema, records = json.loads(sys.stdin.read())
spark = build_spark_session()
register_spark_functions(spark)
rows = spark.createDataFrame([(i, r) for i, r in enumerate(records)], "i INT, p STRING")
both = rows.selectExpr("i", f"to_json(onceflow_json_record(p, '{schema}', {OPTIONS})) AS ours",
                       f"to_json(from_json(p, '{schema}', {OPTIONS})) AS spark")
plan = rows.selectExpr(f"onceflow_json_record(p, '{schema}', {OPTIONS}).a AS a")._jdf.queryExecution().executedPlan()
print(json.dumps({"rows": [r.asDict() for r in both.orderBy("i").collect()], "plan": plan.toString()}))
"""


def test_a_classic_sessions_json_reader_reads_each_record_as_from_json_and_is_compiled() -> None:
    """In a process of its own: a process holds one kind of session, and only a classic one has this reader."""
    require(shutil.which("java") is not None, "Java 17")
    env = {k: v for k, v in os.environ.items() if k not in ("ONCEFLOW_SPARK_REMOTE", "SPARK_REMOTE",
                                                            "SPARK_CONNECT_MODE_ENABLED")}
    run = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps([SCHEMA, RECORDS]), cwd=PROJECT_ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    rows = out["rows"]
    assert [row["i"] for row in rows] == list(range(len(RECORDS)))
    assert [row["ours"] for row in rows] == [row["spark"] for row in rows]
    # The cases are not all alike: read, corrupt, partly read, and not read at all.
    assert sum(row["spark"] is not None and "_corrupt" in row["spark"] for row in rows) >= 10
    assert sum(row["spark"] is not None and "_corrupt" not in row["spark"] for row in rows) >= 8
    # One stage of generated code, with the reader inside it (`from_json` would stand in a stage of its own).
    assert out["plan"].startswith("*(1) Project [onceflow_json_record(p"), out["plan"]
