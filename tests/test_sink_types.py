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
from google.cloud import bigquery
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.commit_step import CommitContext
from jobs.declaration import BigQuerySink, FileSink, FileSource, Pipeline, WindowedOutput
from jobs.panes import CloseStore, Window
from jobs.sinks import output_sinks, publish_closed
from jobs.source_reader import open_source
from orchestration.pipelines import resolve
from resources.bigquery_emulator import BigQueryEmulator
from resources.commit_store import CommitStore
from resources.lake import LakeResource
from resources.settings import load_settings
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


RECORDS = [  # JSON text, so that numbers keep the digits written (1.10 stays 1.10 in the VARIANT)
    '{"id": "a1", "k": "a", "amount": 1.50}',
    '{"id": "a2", "k": "a", "amount": 12345678901234.25, "wide": 12345678901234567890123456.123456789012, '
    '"day": "2026-02-28", "at": "2026-11-21T10:05:03.123456+02:00", "local": "2026-11-21T10:05:03.5", '
    '"tags": ["x", "", "\u00fcn\u00ef"], "counts": {"one": 1, "two": 2}, "geo": {"lat": 52.5, "lon": -13.25}, '
    '"doc": {"n": 1.10, "list": [1, "two", null, true], "deep": {"x": "y"}}, '
    '"items": [{"sku": "s1", "price": 9.99}, {"sku": "s2", "price": 0.5}], '
    '"groups": {"g": [1, 2, 9007199254740993], "e": []}, "visit": {"at": "2026-11-21T08:00:00Z", "page": "/home"}}',
    '{"id": "b1", "k": "b"}',
]


def expected_raw() -> dict[str, dict[str, Any]]:
    """What raw holds per record id (delta-rs reads maps as lists of (key, value) pairs)."""
    nulls = dict.fromkeys(TYPED)
    return {
        "a1": {**nulls, "amount": Decimal("1.50")},
        "a2": {
            "amount": Decimal("12345678901234.25"), "wide": Decimal("12345678901234567890123456.123456789012"),
            "day": date(2026, 2, 28), "at": datetime(2026, 11, 21, 8, 5, 3, 123456, tzinfo=UTC),
            "local": datetime(2026, 11, 21, 10, 5, 3, 500000), "tags": ["x", "", "ünï"],
            "counts": [("one", 1), ("two", 2)], "geo": {"lat": 52.5, "lon": -13.25},
            "items": [{"sku": "s1", "price": Decimal("9.99")}, {"sku": "s2", "price": Decimal("0.50")}],
            "groups": [("g", [1, 2, 9007199254740993]), ("e", [])],
            "visit": {"at": datetime(2026, 11, 21, 8, 0, tzinfo=UTC), "page": "/home"},
        },
        "b1": nulls,
    }


def expected_lines(window: Window) -> list[dict[str, Any]]:
    """The published JSON lines, parsed (numbers as Decimal, so a float's digits are checked too)."""
    start = datetime.fromtimestamp(window.start_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    end = datetime.fromtimestamp(window.end_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    common = {"window_start": start, "window_end": end}
    tail = {"pane": 1, "timing": "on_time"}
    a = {
        **common, "k": "a", "n": 2, "amounts": ["1.50", "12345678901234.25"],
        "last_at": "2026-11-21T08:05:03.123456Z",
        "amount": "12345678901234.25", "wide": 12345678901234567890123456.123456789012, "day": "2026-02-28",
        "at": "2026-11-21T08:05:03.123456Z", "local": "2026-11-21T10:05:03.500000", "tags": ["x", "", "ünï"],
        "counts": {"one": 1, "two": 2}, "geo": {"lat": Decimal("52.5"), "lon": Decimal("-13.25")},
        "doc": {"deep": {"x": "y"}, "list": [1, "two", None, True], "n": Decimal("1.10")},
        "items": [{"sku": "s1", "price": 9.99}, {"sku": "s2", "price": "0.50"}],
        "groups": {"e": [], "g": [1, 2, 9007199254740993]},
        "visit": {"at": "2026-11-21T08:00:00.000000Z", "page": "/home"},
    }
    b = {**common, "k": "b", "n": 1, "amounts": [], "last_at": None, **dict.fromkeys(FIELDS), **tail}
    return [a | tail, b]


def published_lines(home: Path, window: Window) -> list[dict[str, Any]]:
    (part,) = (home / "published" / "typed_values" / f"window={window.key}" / "pane=1").glob("*.jsonl")
    lines = part.read_text().splitlines()
    return [json.loads(line, parse_float=Decimal) for line in lines]


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

    print("DEAD", read_rows(lake.table_path(pipeline.dead_letter_table), ["reason", "detail"]))
    raw = read_rows(runtime.raw_path, ["record_id", *TYPED])
    assert {row[0]: dict(zip(TYPED, row[1:], strict=True)) for row in raw} == expected_raw()

    windows_path = lake.table_path(output.table)
    results = materialize(spark, pipeline, output, window, lake, runtime.raw_path, windows_path)
    from deltalake import DeltaTable
    print("WINDOW SCHEMA", DeltaTable(windows_path).schema())
    print("WINDOW ROWS", DeltaTable(windows_path).to_pyarrow_table().to_pylist())
    print("ARROW", spark.sql(f"SELECT * FROM delta.`{windows_path}`").toArrow().to_pylist())
    sinks = output_sinks(output, lake.sink_root(), lake.staging_root(), bigquery_client.project)
    context = CommitContext(CommitStore(lake.commits()), bigquery=lambda project: bigquery_emulator.client(project))
    outcomes = publish_closed(spark, context, output, sinks, windows_path, results, "run", "run")
    assert [o.outcome for o in outcomes.values()] == ["done"]

    assert published_lines(home, window) == expected_lines(window)


def materialize(spark, pipeline, output, window, lake, raw_path, windows_path):
    from jobs.windows import materialize_windows
    return materialize_windows(spark, pipeline, output, [window], window.end_ms, CloseStore(lake.panes(), output.asset),
                               raw_path, windows_path)
