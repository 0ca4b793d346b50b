"""The functions a classic session's batches are compiled with (`jobs/ingest/CompiledFunction.java`) give exactly what
Spark's own give: `onceflow_json_record` reads every record as `from_json` with the same schema and options (the
same values, partial results and corrupt records), `onceflow_utf8` takes every byte string `try_validate_utf8`
takes, `onceflow_id_hash` hashes every record ID as the driver's ID filters do; and Spark compiles them into the
batch's stage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa

from onceflow.jobs.dedup.fingerprints import id_hash_sql, id_hashes
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
# Byte strings (hex): ASCII, valid 2-, 3- and 4-byte sequences, and what UTF-8 refuses (a lone continuation byte,
# a cut sequence, an overlong form, a surrogate, a code point above U+10FFFF, bytes never used).
BYTES = ["", "7b7d", "c3a9", "e282ac", "f09f9880", "7bc3a97d", "80", "c3", "e282", "c0af", "eda080", "f4908080",
         "ff", "fe", "7b2261223a2280227d", "41" * 40 + "c3"]
# Record IDs of every length to 24 bytes (SipHash takes 8 at a time, the last word holds the rest and the length), in
# 1- to 4-byte UTF-8, long ones, and NULL.
IDS = ["", *("events/files:0123456789é€😀x"[:n] for n in range(1, 25)), "ünïcode-€-1", "0" * 64, "k" * 1000, None]
SCRIPT = """
import json, sys
from onceflow.jobs.ingest.record_fields import OPTIONS
from onceflow.resources.spark import build_spark_session
from onceflow.resources.spark_functions import register_spark_functions
schema, records, hexes, ids, hash_sql = json.loads(sys.stdin.read())
spark = build_spark_session()
register_spark_functions(spark)
rows = spark.createDataFrame([(i, r) for i, r in enumerate(records)], "i INT, p STRING")
both = rows.selectExpr("i", f"to_json(onceflow_json_record(p, '{schema}', {OPTIONS})) AS ours",
                       f"to_json(from_json(p, '{schema}', {OPTIONS})) AS spark")
plan = rows.selectExpr(f"onceflow_json_record(p, '{schema}', {OPTIONS}).a AS a")._jdf.queryExecution().executedPlan()
data = spark.createDataFrame([(i, bytes.fromhex(h)) for i, h in enumerate(hexes)], "i INT, b BINARY")
texts = data.selectExpr("i", "onceflow_utf8(b) AS ours", "try_validate_utf8(CAST(b AS STRING)) AS spark")
text_plan = data.selectExpr("onceflow_utf8(b) AS t")._jdf.queryExecution().executedPlan()
hashed = spark.createDataFrame(list(enumerate(ids)), "i INT, record_id STRING").selectExpr("i", *hash_sql)
print(json.dumps({"rows": [r.asDict() for r in both.orderBy("i").collect()], "plan": plan.toString(),
                  "texts": [r.asDict() for r in texts.orderBy("i").collect()], "text_plan": text_plan.toString(),
                  "hashes": [list(r)[1:] for r in hashed.orderBy("i").collect()],
                  "hash_plan": hashed._jdf.queryExecution().executedPlan().toString()}))
"""


def test_a_classic_sessions_compiled_functions_give_what_spark_gives_and_are_compiled() -> None:
    """In a process of its own: a process holds one kind of session, and only a classic one has these functions."""
    require(shutil.which("java") is not None, "Java 17")
    env = {k: v for k, v in os.environ.items() if k not in ("ONCEFLOW_SPARK_REMOTE", "SPARK_REMOTE",
                                                            "SPARK_CONNECT_MODE_ENABLED")}
    run = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps([SCHEMA, RECORDS, BYTES, IDS, id_hash_sql()]), cwd=PROJECT_ROOT,
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
    texts = out["texts"]
    assert [row["i"] for row in texts] == list(range(len(BYTES)))
    assert [row["ours"] for row in texts] == [row["spark"] for row in texts]
    assert sum(row["spark"] is None for row in texts) == 10
    assert out["text_plan"].startswith("*(1) Project [onceflow_utf8(b"), out["text_plan"]
    prints = id_hashes(pa.array(IDS[:-1]))
    assert out["hashes"] == [[int(h) for h in pair] for pair in zip(prints.first.view(np.int64),
                                                                    prints.second.view(np.int64), strict=True)] \
        + [[None, None]]
    assert out["hash_plan"].startswith("*(1) Project [i#"), out["hash_plan"]
    assert "onceflow_id_hash(record_id" in out["hash_plan"], out["hash_plan"]
