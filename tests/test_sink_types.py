"""Every advertised type, from a JSON record through raw, a window transform, the file sink and BigQuery.

One pipeline declares each type (DECIMAL, DATE, TIMESTAMP, TIMESTAMP_NTZ, ARRAY, MAP, STRUCT, VARIANT, and nested
combinations); its transform passes the values through per key. Each stage is checked value by value: raw and the
window table read back with delta-rs, the published JSON lines as text, and the BigQuery table's schema and rows.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from google.cloud import bigquery
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.types import VariantVal

from onceflow.jobs.declare.declaration import BigQuerySink, FileSink, Pipeline, WindowedOutput
from onceflow.jobs.declare.sources import FileSource
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sinks import output_sinks, publish_closed
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.emulators.bigquery import BigQueryEmulator
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings
from tests.delta_reader import read_rows
from tests.pipelines import drain

SCHEMA = (
    "k STRING NOT NULL, amount DECIMAL(18,2), wide DECIMAL(38,12), day DATE, at TIMESTAMP, local TIMESTAMP_NTZ, "
    "tags ARRAY<STRING>, counts MAP<STRING, INT>, geo STRUCT<lat: DOUBLE, lon: DOUBLE>, doc VARIANT, "
    "items ARRAY<STRUCT<sku: STRING, price: DECIMAL(10,2)>>, groups MAP<STRING, ARRAY<BIGINT>>, "
    "visit STRUCT<at: TIMESTAMP, page: STRING>"
)
FIELDS = ["amount", "wide", "day", "at", "local", "tags", "counts", "geo", "doc", "items", "groups", "visit"]
TYPED = [f for f in FIELDS if f != "doc"]


def passthrough(records: DataFrame) -> DataFrame:
    """Per key: how many records, their amounts (sorted), and the newest record's values (by record id)."""
    return records.groupBy("k").agg(
        F.count("*").alias("n"),
        F.sort_array(F.collect_list("amount")).alias("amounts"),
        F.max("at").alias("last_at"),
        *(F.max_by(name, "record_id").alias(name) for name in FIELDS),
    )


DOC_FIELD = ('"doc": {"n": 1.10, "p": 0.1234567890123456789, "big": 9007199254740993, "list": [1, "two", null, '
             'true], "deep": {"x": "y"}}, ')
RECORDS = [  # JSON text, so that numbers keep the digits written; a MAP keeps the key order a record sends
    '{"id": "a1", "k": "a", "amount": 1.50}',
    '{"id": "a2", "k": "a", "amount": 12345678901234.25, "wide": 1234567.123456789012, '
    '"day": "2026-02-28", "at": "2026-11-21T10:05:03.123456+02:00", "local": "2026-11-21T10:05:03.5", '
    '"tags": ["x", "", "ünï"], "counts": {"one": 1, "two": 2}, "geo": {"lat": 52.5, "lon": -13.25}, '
    f'{DOC_FIELD}"items": [{{"sku": "s1", "price": 9.99}}, {{"sku": "s2", "price": 0.5}}], '
    '"groups": {"e": [], "g": [1, 2, 9007199254740993]}, "visit": {"at": "2026-11-21T08:00:00Z", "page": "/home"}}',
    '{"id": "b1", "k": "b"}',
]
DOC = '{"big":9007199254740993,"deep":{"x":"y"},"list":[1,"two",null,true],"n":1.1,"p":0.1234567890123456789}'
"""The VARIANT as a JSON value (keys sorted, as a variant holds them); compared as parsed with exact decimals."""
AT = datetime(2026, 11, 21, 8, 5, 3, 123456, tzinfo=UTC)
VISIT_AT = datetime(2026, 11, 21, 8, 0, tzinfo=UTC)
LOCAL = datetime(2026, 11, 21, 10, 5, 3, 500000)
VALUES = {  # record a2's values as delta-rs reads them (a map as (key, value) pairs, keys sorted)
    "amount": Decimal("12345678901234.25"), "wide": Decimal("1234567.123456789012"), "day": date(2026, 2, 28),
    "at": AT, "local": LOCAL, "tags": ["x", "", "ünï"], "counts": [("one", 1), ("two", 2)],
    "geo": {"lat": 52.5, "lon": -13.25}, "doc": DOC,
    "items": [{"sku": "s1", "price": Decimal("9.99")}, {"sku": "s2", "price": Decimal("0.50")}],
    "groups": [("e", []), ("g", [1, 2, 9007199254740993])], "visit": {"at": VISIT_AT, "page": "/home"},
}
WINDOW_COLUMNS = [
    ("window_start", "timestamp"), ("window_end", "timestamp"), ("k", "string"), ("n", "bigint"),
    ("amounts", "array<decimal(18,2)>"), ("last_at", "timestamp"), ("amount", "decimal(18,2)"),
    ("wide", "decimal(38,12)"), ("day", "date"), ("at", "timestamp"), ("local", "timestamp_ntz"),
    ("tags", "array<string>"), ("counts", "map<string,int>"), ("geo", "struct<lat:double,lon:double>"),
    ("doc", "variant"), ("items", "array<struct<sku:string,price:decimal(10,2)>>"),
    ("groups", "map<string,array<bigint>>"), ("visit", "struct<at:timestamp,page:string>"),
    ("raw_version", "bigint"), ("pane", "int"), ("timing", "string"),
]
BIGQUERY_COLUMNS = [
    ("window_start", "TIMESTAMP", "NULLABLE"), ("window_end", "TIMESTAMP", "NULLABLE"), ("k", "STRING", "NULLABLE"),
    ("n", "INTEGER", "NULLABLE"), ("amounts", "NUMERIC", "REPEATED"), ("last_at", "TIMESTAMP", "NULLABLE"),
    ("amount", "NUMERIC", "NULLABLE"), ("wide", "BIGNUMERIC", "NULLABLE"), ("day", "DATE", "NULLABLE"),
    ("at", "TIMESTAMP", "NULLABLE"), ("local", "DATETIME", "NULLABLE"), ("tags", "STRING", "REPEATED"),
    ("counts", "JSON", "NULLABLE"),
    ("geo", "RECORD", "NULLABLE", [("lat", "FLOAT", "NULLABLE"), ("lon", "FLOAT", "NULLABLE")]),
    ("doc", "JSON", "NULLABLE"),
    ("items", "RECORD", "REPEATED", [("sku", "STRING", "NULLABLE"), ("price", "NUMERIC", "NULLABLE")]),
    ("groups", "JSON", "NULLABLE"),
    ("visit", "RECORD", "NULLABLE", [("at", "TIMESTAMP", "NULLABLE"), ("page", "STRING", "NULLABLE")]),
    ("raw_version", "INTEGER", "NULLABLE"), ("pane", "INTEGER", "NULLABLE"), ("timing", "STRING", "NULLABLE"),
]


def exact(text: str) -> Any:
    """JSON text parsed with numbers as Decimal: equal only when every digit is."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def variant_json(value: dict[str, bytes] | None) -> Any:
    """A VARIANT as delta-rs reads it (its binary encoding), as exact JSON."""
    return None if value is None else exact(VariantVal(value["value"], value["metadata"]).toJson())


def window_rows(window: Window, raw_version: int) -> list[dict[str, Any]]:
    """The window table's rows, as delta-rs reads them (the variant decoded with `variant_json`)."""
    start, end = (datetime.fromtimestamp(ms / 1000, UTC) for ms in (window.start_ms, window.end_ms))
    common = {"window_start": start, "window_end": end, "raw_version": raw_version, "pane": 1, "timing": "on_time"}
    a = {**common, "k": "a", "n": 2, "amounts": [Decimal("1.50"), Decimal("12345678901234.25")], "last_at": AT,
         **VALUES, "doc": exact(DOC)}
    b = {**common, "k": "b", "n": 1, "amounts": [], "last_at": None, **dict.fromkeys(FIELDS)}
    return [a, b]


def published_lines(window: Window, raw_version: int) -> list[str]:
    """The published file's lines, exactly (rows sorted by their text)."""
    start, end = (datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                  for ms in (window.start_ms, window.end_ms))
    head = f'{{"window_start":"{start}","window_end":"{end}",'
    tail = f'"raw_version":{raw_version},"pane":1,"timing":"on_time"}}'
    a = (
        f'{head}"k":"a","n":2,"amounts":["1.50","12345678901234.25"],"last_at":"2026-11-21T08:05:03.123456Z",'
        '"amount":"12345678901234.25","wide":"1234567.123456789012","day":"2026-02-28",'
        '"at":"2026-11-21T08:05:03.123456Z","local":"2026-11-21T10:05:03.500000","tags":["x","","ünï"],'
        f'"counts":{{"one":1,"two":2}},"geo":{{"lat":52.5,"lon":-13.25}},"doc":{DOC},'
        '"items":[{"sku":"s1","price":"9.99"},{"sku":"s2","price":"0.50"}],"groups":{"e":[],"g":[1,2,9007199254740993]},'
        f'"visit":{{"at":"2026-11-21T08:00:00.000000Z","page":"/home"}},{tail}'
    )
    nulls = "".join(f'"{name}":null,' for name in FIELDS)
    b = f'{head}"k":"b","n":1,"amounts":[],"last_at":null,{nulls}{tail}'
    return [a, b]


def bigquery_rows(window: Window, raw_version: int) -> list[dict[str, Any]]:
    """The BigQuery table's rows: JSON columns come back parsed (numbers as INT64 or FLOAT64), a NULL array as []."""
    start, end = (datetime.fromtimestamp(ms / 1000, UTC) for ms in (window.start_ms, window.end_ms))
    common = {"window_start": start, "window_end": end, "raw_version": raw_version, "pane": 1, "timing": "on_time"}
    doc = {"big": 9007199254740993, "deep": {"x": "y"}, "list": [1, "two", None, True], "n": 1.1,
           "p": 0.1234567890123456789}
    a = {**common, "k": "a", "n": 2, "amounts": [Decimal("1.50"), Decimal("12345678901234.25")], "last_at": AT,
         **VALUES, "counts": {"one": 1, "two": 2}, "doc": doc, "groups": {"e": [], "g": [1, 2, 9007199254740993]}}
    b = {**common, "k": "b", "n": 1, "amounts": [], "last_at": None, **dict.fromkeys(FIELDS),
         "tags": [], "items": []}
    return [a, b]


def columns(fields: list[bigquery.SchemaField]) -> list[tuple[Any, ...]]:
    return [(f.name, f.field_type, f.mode, *([columns(list(f.fields))] if f.fields else [])) for f in fields]


@pytest.mark.engine_paths
def test_every_type_round_trips_from_a_record_to_the_sinks(
    spark: SparkSession, tmp_path: Path, home: Path, bigquery_emulator: BigQueryEmulator,
    bigquery_client: bigquery.Client,
) -> None:
    dataset = bigquery_client.create_dataset(f"test_{uuid.uuid4().hex[:12]}").dataset_id
    base = (int(time.time() * 1000) - 2 * 3600_000) // 60_000 * 60_000
    window = Window(base, base + 60_000)
    output = WindowedOutput(asset="typed_values", window="1m", keys=["k"], transform=passthrough,
                            sinks=[FileSink(), BigQuerySink(table="typed_values", dataset=dataset)])
    source = FileSource(directory=str(tmp_path / "in"), id_field="id", timestamp_field="ts")
    pipeline = resolve(Pipeline(name="typed", source=source, schema=SCHEMA, outputs=[output]), load_settings())
    (tmp_path / "in").mkdir()
    lines = [f'{record[:-1]}, "ts": {base + i * 1000}}}' for i, record in enumerate(RECORDS)]
    (tmp_path / "in" / "1.jsonl").write_text("".join(f"{line}\n" for line in lines))
    lake = LakeResource(home=str(home))
    runtime = open_source(pipeline, lake)
    drain(lambda: spark, runtime)

    # raw: every record valid, each typed column holding the record's value
    assert read_rows(lake.table_path(pipeline.dead_letter_table), ["reason", "detail"]) == []
    raw = {row["record_id"]: row for row in DeltaTable(runtime.raw_path).to_pyarrow_table().to_pylist()}
    got = {rid: {**{f: row[f] for f in FIELDS}, "doc": variant_json(row["doc"])} for rid, row in raw.items()}
    assert got == {"a1": {**dict.fromkeys(FIELDS), "amount": Decimal("1.50")},
                   "a2": {**VALUES, "doc": exact(DOC)}, "b1": dict.fromkeys(FIELDS)}

    # the window table: the transform's columns with their types, and its values
    windows_path = lake.table_path(output.table)
    (result,) = materialize_windows(spark, pipeline, output, [window], window.end_ms,
                                    CloseStore(lake.panes(), output.asset), runtime.raw_path, windows_path)
    table = DeltaTable(windows_path)
    schema = T.StructType.fromJson(json.loads(table.schema().to_json()))
    assert [(f.name, f.dataType.simpleString()) for f in schema] == WINDOW_COLUMNS
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda row: row["k"])
    assert [{**row, "doc": variant_json(row["doc"])} for row in rows] == window_rows(window, result.raw_version)

    # publish: the file sink's JSON lines, exactly, and the BigQuery table's columns and rows
    sinks = output_sinks(output, lake.sink_root(), lake.staging_root(), bigquery_client.project)
    context = CommitContext(CommitStore(lake.commits()), bigquery=lambda project: bigquery_emulator.client(project))
    outcomes = publish_closed(spark, context, output, sinks, windows_path, [result], "run", "run")
    assert [(o.outcome, o.error) for o in outcomes.values()] == [("done", None)]
    (part,) = (home / "published" / "typed_values" / f"window={window.key}" / "pane=1").glob("*.jsonl")
    assert part.read_text(encoding="utf-8").splitlines() == published_lines(window, result.raw_version)

    bigquery_table = f"{bigquery_client.project}.{dataset}.typed_values"
    assert columns(bigquery_client.get_table(bigquery_table).schema) == BIGQUERY_COLUMNS
    found = sorted((dict(row) for row in bigquery_client.query_and_wait(f"SELECT * FROM `{bigquery_table}`")),
                   key=lambda row: row["k"])
    assert found == bigquery_rows(window, result.raw_version)


@pytest.mark.engine_paths
def test_every_type_but_variant_lands_in_raw_as_sent(spark: SparkSession, tmp_path: Path, home: Path) -> None:
    """Without a VARIANT column, a Spark Connect batch's rows are written by delta-rs, not staged by Delta's writer
    (a classic session's by Delta's writer): the same values either way, read back with delta-rs and with Spark."""
    base = (int(time.time() * 1000) - 2 * 3600_000) // 60_000 * 60_000
    source = FileSource(directory=str(tmp_path / "in"), id_field="id", timestamp_field="ts")
    pipeline = resolve(Pipeline(name="typed_plain", source=source, schema=SCHEMA.replace(" doc VARIANT,", "")),
                       load_settings())
    (tmp_path / "in").mkdir()
    records = [record.replace(DOC_FIELD, "") for record in RECORDS]
    assert all('"doc"' not in record for record in records)
    lines = [f'{record[:-1]}, "ts": {base + i * 1000}}}' for i, record in enumerate(records)]
    (tmp_path / "in" / "1.jsonl").write_text("".join(f"{line}\n" for line in lines))
    runtime = open_source(pipeline, LakeResource(home=str(home)))
    drain(lambda: spark, runtime)

    raw = {row["record_id"]: row for row in DeltaTable(runtime.raw_path).to_pyarrow_table().to_pylist()}
    assert {rid: {f: row[f] for f in TYPED} for rid, row in raw.items()} == {
        "a1": {**dict.fromkeys(TYPED), "amount": Decimal("1.50")}, "a2": {f: VALUES[f] for f in TYPED},
        "b1": dict.fromkeys(TYPED)}
    assert not list(Path(runtime.raw_path).glob("onceflow-*"))  # nothing staged
    by_spark = {row["record_id"]: row for row in spark.read.format("delta").load(runtime.raw_path).collect()}
    assert by_spark["a2"]["at"].replace(tzinfo=UTC) == AT and by_spark["a2"]["local"] == LOCAL and by_spark["a2"]["items"][1]["price"] == (
        Decimal("0.50"))
