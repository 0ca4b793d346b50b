"""How a record's JSON values become typed columns (DESIGN section 6a, docs/records.md's field table), type by type, at
the top level and nested: what Spark's JSON reader (`from_json` with the same schema) accepts becomes exactly its
value; what onceflow refuses on purpose is a dead letter with its reason and the path of the failing value."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pyspark.sql import DataFrame, SparkSession

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.ingest.local_projection import on_driver
from onceflow.jobs.ingest.validation import FLAGGED, _explanation, classify, explain_flagged
from onceflow.resources.spark_functions import compiled_functions
from tests.spark_plans import parsed_plan

AT_MS = 1_795_000_000_000
OK = None
# Per type: (JSON value, None when it is read as Spark reads it, else (reason, path below the field)).
CASES: dict[str, list[tuple[str, tuple[str, str] | None]]] = {
    "STRING": [('"abc"', OK), ("5", OK), ('{"a": [1]}', OK), ("[1, 2]", OK), ("true", OK), ('""', OK)],
    "BOOLEAN": [("true", OK), ("false", OK), ('"true"', ("wrong_type", "")), ("1", ("wrong_type", ""))],
    "TINYINT": [("127", OK), ("-128", OK), ("200", ("out_of_range", "")), ("-129", ("out_of_range", "")),
                ("5.0", ("wrong_type", "")), ("5.5", ("wrong_type", "")), ('"5"', ("wrong_type", ""))],
    "SMALLINT": [("32767", OK), ("40000", ("out_of_range", "")), ("1e2", ("wrong_type", ""))],
    "INT": [("-2147483648", OK), ("3000000000", ("out_of_range", "")), ("5.5", ("wrong_type", ""))],
    "BIGINT": [("9223372036854775807", OK), ("9223372036854775808", ("out_of_range", "")),
               ('"7"', ("wrong_type", ""))],
    "FLOAT": [("1.5", OK), ("3", OK), ("-2.5e-3", OK), ("1e40", ("out_of_range", "")),
              ('"NaN"', ("wrong_type", "")), ('"abc"', ("wrong_type", ""))],
    "DOUBLE": [("1.5", OK), ("1e308", OK), ("1e400", ("out_of_range", "")), ('"Infinity"', ("wrong_type", "")),
               ('"abc"', ("wrong_type", "")), ("[1.5]", ("wrong_type", ""))],
    "DECIMAL(6,2)": [('"123.45"', OK), ("123.45", OK), ('"-0.5"', OK), ("7", OK), ('"1e2"', OK), ("1E2", OK),
                     ('"123.456"', ("out_of_range", "")), ("123.456", ("out_of_range", "")),
                     ('"12345.6"', ("out_of_range", "")), ("1e30", ("out_of_range", "")),
                     ('"12.5.0"', ("wrong_type", "")), ("true", ("wrong_type", "")), ("{}", ("wrong_type", ""))],
    "DATE": [('"2024-01-02"', OK), ('"2024-01-02T10:00:00Z"', OK), ("19000", ("wrong_type", "")),
             ('"tomorrow"', ("wrong_type", ""))],
    "TIMESTAMP": [('"2024-01-02T03:04:05Z"', OK), ('"2024-01-02 03:04:05.123+02:00"', OK), ('"2024-01-02"', OK),
                  ("1700000000", OK), ("1700000000000", ("out_of_range", "")), ('"tomorrow"', ("wrong_type", "")),
                  ("1.5e9", ("wrong_type", ""))],
    "TIMESTAMP_NTZ": [('"2024-01-02T03:04:05"', OK), ('"2024-01-02T03:04:05Z"', ("wrong_type", ""))],
    "ARRAY<INT>": [("[1, 2]", OK), ("[]", OK), ("[1, null]", OK), ('[1, "2"]', ("wrong_type", "[1]")),
                   ("[1, 300000000000]", ("out_of_range", "[1]")), ("5", ("wrong_type", "")),
                   ('{"a": 1}', ("wrong_type", ""))],
    "MAP<STRING, DECIMAL(6,2)>": [('{"a": "1.5", "b": 2}', OK), ("{}", OK), ('{"a": 1, "b": "x"}', ("wrong_type", '["b"]')),
                                  ('{"a": 0.001}', ("out_of_range", '["a"]')), ("[1]", ("wrong_type", ""))],
    "STRUCT<a: INT, b: STRING NOT NULL, c: ARRAY<DECIMAL(4,1)>>": [
        ('{"a": 1, "b": "x", "c": ["1.5", 2]}', OK), ('{"b": "x", "zz": 1}', OK),
        ('{"a": 1}', ("missing_field", ".b")), ('{"a": "1", "b": "x"}', ("wrong_type", ".a")),
        ('{"b": "x", "c": [1, "1.25"]}', ("out_of_range", ".c[1]")), ('"x"', ("wrong_type", "")),
    ],
    # Checked without a lambda (an array's bounds and decimals, a field of an array's structs) and with one (an
    # element's NOT NULL field, an array of arrays).
    "ARRAY<STRUCT<q: TINYINT, d: DECIMAL(4,1), s: STRING NOT NULL>>": [
        ('[{"q": 1, "d": "1.5", "s": "a"}, null, {"s": "b"}]', OK),
        ('[{"s": "a"}, {"q": 200, "s": "b"}]', ("out_of_range", "[1].q")),
        ('[{"d": 1.25, "s": "a"}]', ("out_of_range", "[0].d")),
        ('[{"q": 1, "s": "a"}, {"q": 2}]', ("missing_field", "[1].s")),
    ],
    "ARRAY<ARRAY<FLOAT>>": [("[[1.5], null, [], [null]]", OK), ("[[1.5], [2, 1e40]]", ("out_of_range", "[1][1]"))],
    "VARIANT": [('{"a": [1, 2.5, "x"]}', OK), ('"s"', OK), ("5", OK), ("null", OK)],
}


def _stamped(body: str) -> str:
    """A JSON object's text with the event time added in front."""
    return f'{{"at": {AT_MS}, {body[1:]}'


def _landed(spark: SparkSession, lines: list[str]) -> DataFrame:
    return spark.createDataFrame(
        [(i, f"f.jsonl:{i}", None, None, line.encode()) for i, line in enumerate(lines)],
        "ordinal BIGINT, source_position STRING, publish_time TIMESTAMP, attributes MAP<STRING, STRING>, data BINARY",
    )


def _classify(spark: SparkSession, schema: str, lines: list[str]) -> tuple[list, list]:
    """Each line classified, in order, as (reason, detail, typed fields as JSON), and the same lines through
    `from_json` with the same schema (as JSON)."""
    landed = _landed(spark, lines)
    contract = RecordContract(schema=parse_schema(schema), max_record_bytes=10_000, max_clock_skew_ms=3_600_000,
                              time_field="at")
    typed = f"to_json(struct({', '.join(f.name for f in contract.schema)})) AS typed"
    out = classify(landed, contract, AT_MS, None, batch_id=1).selectExpr(
        "ordinal", "reason", "detail", typed, "raw", "record_id", "event_time")
    rows = explain_flagged(spark, contract, out.toArrow()).sort_by("ordinal")
    spark_read = landed.orderBy("ordinal").selectExpr(f"to_json(from_json(CAST(data AS STRING), '{schema}'))")
    return list(zip(*(rows[name].to_pylist() for name in ("reason", "detail", "typed")), strict=True)), [
        row[0] for row in spark_read.collect()]


@pytest.mark.engine_paths
@pytest.mark.parametrize("declared", list(CASES))
def test_a_json_value_is_read_as_spark_reads_it_or_refused_with_its_path(spark: SparkSession, declared: str) -> None:
    cases = CASES[declared]
    # Each value at the top level and nested, as the second element of an array inside a struct.
    top = [json.dumps({"f": "VALUE"}).replace('"VALUE"', value) for value, _ in cases]
    nested = [json.dumps({"n": {"inner": [None, "VALUE"]}}).replace('"VALUE"', value) for value, _ in cases]
    got, spark_read = _classify(spark, f"f {declared}, n STRUCT<inner: ARRAY<{declared}>>", list(map(_stamped, top + nested)))
    expected = []
    for i, (_, refused) in enumerate(cases * 2):
        if refused is None:
            expected.append((None, None, spark_read[i]))
        else:
            path = ("f" if i < len(cases) else "n.inner[1]") + refused[1]
            expected.append((refused[0], f"`{path}`", None))
    assert [(reason, detail and detail.split(" ")[0], None if reason else typed) for reason, detail, typed in got] == (
        expected
    )


@pytest.mark.engine_paths
def test_flagged_records_are_explained_as_a_spark_job_explains_them(spark: SparkSession) -> None:
    """A classic session explains flagged records on its driver (`LocalProjection`), and so does a Spark Connect
    server onceflow started (`ProjectionPlugin`): it must say, for every case above, exactly what a Spark job over
    the same records says."""
    declared = list(CASES)
    schema = ", ".join(f"f{k} {kind}" for k, kind in enumerate(declared))
    lines = [json.dumps({"id": f"r{k}-{i}", "at": AT_MS - i, f"f{k}": "VALUE"}).replace('"VALUE"', value)
             for k, kind in enumerate(declared) for i, (value, refused) in enumerate(CASES[kind]) if refused]
    contract = RecordContract(schema=parse_schema(schema), max_record_bytes=10_000, max_clock_skew_ms=3_600_000,
                              id_field="id", time_field="at")
    out = classify(_landed(spark, lines), contract, AT_MS, None, batch_id=1).selectExpr(
        "ordinal", "reason", "detail", "raw", "record_id", "event_time").toArrow().sort_by("ordinal")
    assert set(out["reason"].to_pylist()) == {FLAGGED}
    assert compiled_functions(spark)  # the driver's evaluation, not the job, on either engine path
    got = explain_flagged(spark, contract, out)
    asked = out.select(["raw", "record_id", "event_time", "ordinal"]).rename_columns(
        ["payload", "record_id", "event_time", "_i"])
    connect = not hasattr(spark, "_jsparkSession")
    job = spark.createDataFrame(asked).select(*_explanation(contract, connect)).toArrow().sort_by("_i")
    columns = ("reason", "detail", "record_id", "event_time")
    assert [got[c].to_pylist() for c in columns] == [job[c].to_pylist() for c in columns]
    assert len(lines) > 40 and None not in got["detail"].to_pylist()
    if connect:  # the server's plan of the explanation is already its rows: `ProjectionPlugin` evaluated it
        asked_plan = parsed_plan(on_driver(spark.createDataFrame(asked).select(*_explanation(contract, connect))))
        assert asked_plan.startswith("LocalRelation ["), asked_plan


@pytest.mark.engine_paths
def test_a_record_is_read_by_spark_rules_where_json_leaves_them_open(spark: SparkSession) -> None:
    lines = [
        _stamped('{"f": "first", "f": "last"}'),  # a repeated key: the last value counts, as in Spark
        _stamped('{"F": "other case"}'),  # names match exactly: `F` is not `f`
        _stamped('{"f": "x"} trailing text'),  # Spark reads the first value of the text, as the VARIANT reader did
        '{"f": NaN}',  # not JSON: NaN and Infinity are no JSON tokens
        "{'f': 'x'}",  # not JSON: single quotes
        '["f"]',
        "",
    ]
    got, _ = _classify(spark, "f STRING, d DOUBLE", lines)
    assert [(reason, detail, None if reason else typed) for reason, detail, typed in got] == [
        (None, None, '{"f":"last"}'),
        (None, None, "{}"),
        (None, None, '{"f":"x"}'),
        ("not_json", "payload is not JSON", None),
        ("not_json", "payload is not JSON", None),
        ("not_json", "payload is JSON ARRAY<STRING>, not an object", None),
        ("not_json", "payload is not JSON", None),
    ]


@pytest.mark.engine_paths
def test_a_line_that_is_no_json_object_is_flagged_in_the_batch_and_named_not_json_after(spark: SparkSession) -> None:
    """A line that is not a JSON object (the commonest bad line, one cut short) is only flagged in the batch's plan
    (asking whether it is an object there is a second `from_json`, which Spark does not compile into the stage);
    `explain_flagged` names it `not_json`, with what the payload is; such a record's ID is its position (a payload
    that is not JSON has no fields)."""
    contract = RecordContract(schema=parse_schema("f STRING, d DOUBLE"), max_record_bytes=10_000,
                              max_clock_skew_ms=3_600_000, id_field="id", time_field="at")
    lines = [_stamped('{"id": "e-1", "f": "x", "d": 1.5}')[:-9], '["f"]', _stamped('{"f": "x", "d": "y"}'),
             _stamped('{"id": "e-4", "f": "x"}')]
    classified = classify(_landed(spark, lines), contract, AT_MS, None, batch_id=1).orderBy("ordinal").selectExpr(
        "ordinal", "reason", "detail", "raw", "record_id", "event_time").toArrow()
    assert classified["reason"].to_pylist() == [FLAGGED, FLAGGED, FLAGGED, None]
    got = explain_flagged(spark, contract, classified)
    assert list(zip(got["reason"].to_pylist(), got["detail"].to_pylist(), got["record_id"].to_pylist(),
                    strict=True)) == [
        ("not_json", "payload is not JSON", "f.jsonl:0"),
        ("not_json", "payload is JSON ARRAY<STRING>, not an object", "f.jsonl:1"),
        ("wrong_type", "`d` is STRING \"y\", not DOUBLE", "f.jsonl:2"),
        (None, None, "e-4"),
    ]


@pytest.mark.engine_paths
def test_a_refused_value_is_named_with_what_was_found(spark: SparkSession) -> None:
    bodies = ['{"items": [{"price": "9.99"}, {"price": "1.5"}, {"price": "abc"}]}', '{"items": [{"price": 1e3}]}']
    got, _ = _classify(spark, "items ARRAY<STRUCT<price: DECIMAL(5,2)>> NOT NULL", list(map(_stamped, bodies)))
    assert [(reason, detail) for reason, detail, _ in got] == [
        ("wrong_type", '`items[2].price` is STRING "abc", not DECIMAL(5,2)'),
        ("out_of_range", "`items[0].price` is DOUBLE 1000.0, which does not fit DECIMAL(5,2)"),
    ]


@pytest.mark.engine_paths
def test_a_refused_record_keeps_the_id_and_event_time_written_after_its_failing_value(spark: SparkSession) -> None:
    """Spark's conversion may lose a record's other fields at a value it cannot convert (one inside a STRUCT, when
    the session keeps no partial results: `spark.sql.json.enablePartialResults`, which users may turn off): a dead
    letter's ID and event time are read again from its payload (so a redelivered bad record is held once, by its
    ID)."""
    lines = [f'{{"m": {{"x": "abc"}}, "id": "e-1", "at": {AT_MS - 5}}}', f'{{"n": 5, "id": "e-2", "at": {AT_MS - 7}}}',
             '{"m": {"x": 1}, "n": 1.5, "id": "e-3"}']
    contract = RecordContract(schema=parse_schema("m STRUCT<x: INT>, n INT"), max_record_bytes=10_000,
                              max_clock_skew_ms=3_600_000, id_field="id", time_field="at")
    spark.conf.set("spark.sql.json.enablePartialResults", "false")
    try:
        out = classify(_landed(spark, lines), contract, AT_MS, None, batch_id=1).selectExpr(
            "ordinal", "reason", "detail", "raw", "record_id", "event_time")
        rows = explain_flagged(spark, contract, out.toArrow()).sort_by("ordinal")
    finally:
        spark.conf.unset("spark.sql.json.enablePartialResults")
    assert [(row["reason"], row["record_id"], row["event_time"] and int(row["event_time"].timestamp() * 1000))
            for row in rows.to_pylist()] == [("wrong_type", "e-1", AT_MS - 5), (None, "e-2", AT_MS - 7),
                                             ("wrong_type", "e-3", None)]


@pytest.mark.engine_paths
def test_an_event_time_outside_the_batch_window_is_refused_naming_both_times(spark: SparkSession) -> None:
    """More than `max_clock_skew` after the batch time, or before the dedup horizon's floor: each a dead letter
    whose detail names the event time and the bound it broke, as Spark writes a TIMESTAMP."""
    hour = 3_600_000
    floor = AT_MS - 24 * hour
    times = {"ok": AT_MS - hour, "late": AT_MS + 2 * hour, "old": floor - hour, "edge": floor}
    landed = spark.createDataFrame(
        [(i, f"f.jsonl:{i}", None, None, json.dumps({"at": at, "id": name}).encode())
         for i, (name, at) in enumerate(times.items())],
        "ordinal BIGINT, source_position STRING, publish_time TIMESTAMP, attributes MAP<STRING, STRING>, data BINARY",
    )
    contract = RecordContract(schema=parse_schema("id STRING"), max_record_bytes=10_000, max_clock_skew_ms=hour,
                              time_field="at")

    def verdicts(horizon_floor_ms: int | None) -> list[tuple]:
        out = classify(landed, contract, AT_MS, horizon_floor_ms, batch_id=1).orderBy("ordinal")
        return [tuple(row) for row in out.select("reason", "detail").collect()]

    def text(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")

    late = ("event_time_out_of_range",
            f"event time {text(times['late'])} is more than 3600s after the batch time {text(AT_MS)}")
    assert verdicts(floor) == [
        (None, None), late,
        ("beyond_dedup_horizon", f"event time {text(times['old'])} is older than the dedup horizon ({text(floor)})"),
        (None, None),
    ]
    assert verdicts(None) == [(None, None), late, (None, None), (None, None)]  # at least once: no horizon
