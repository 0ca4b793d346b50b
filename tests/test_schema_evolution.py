"""Changing a pipeline's schema: new nullable fields evolve the tables, any other change is refused at load.

Tables are read back with delta-rs; batches and windows run in this process on the engine path under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow.jobs.declare.declaration import DeclarationError, Pipeline, WindowedOutput
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.declare.sources import FileSource
from onceflow.jobs.delta.raw_table import ensure_raw_table
from onceflow.jobs.delta.schema_evolution import Mismatch, differences
from onceflow.jobs.delta.transactions import append_once, create_table_once, table_properties
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.checks import output_mismatches
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.definitions import definitions
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings
from tests.delta_reader import read_rows, table_version
from tests.pipelines import drain

S = "key STRING NOT NULL, value BIGINT NOT NULL"
S_NOTE = f"{S}, note STRING"
WINDOW_ROWS = ["window_start", "key", "n", "total", "last_note", "pane", "raw_version"]


def totals(records: DataFrame) -> DataFrame:
    return records.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))


def totals_with_note(records: DataFrame) -> DataFrame:
    """`totals` plus a column the transform gained with the schema's new field."""
    return records.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"),
                                      F.max("note").alias("last_note"))


def declared(directory: Path, schema: str, transform=totals) -> Pipeline:
    source = FileSource(directory=str(directory), id_field="event_id", timestamp_field="event_time")
    output = WindowedOutput(asset="totals", window="1m", keys=["key"], transform=transform)
    return resolve(Pipeline(name="evolving", source=source, schema=schema, outputs=[output]), load_settings())


def write_records(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def record(event_id: str, time_ms: int, key: str, value: int, note: str | None = None) -> dict:
    fields = {"event_id": event_id, "event_time": time_ms, "key": key, "value": value}
    return fields if note is None else {**fields, "note": note}


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@pytest.mark.engine_paths
def test_a_new_nullable_field_evolves_raw_and_window_tables(spark: SparkSession, tmp_path: Path, home: Path) -> None:
    base = (int(time.time() * 1000) - 2 * 3600_000) // 60_000 * 60_000
    w0, w1 = Window(base, base + 60_000), Window(base + 60_000, base + 120_000)
    lake = LakeResource(home=str(home))
    incoming = tmp_path / "in"
    # Under S the note is no column (it stays in the payload); the same JSON arrives before and after the change.
    write_records(incoming / "1.jsonl", [record("a1", base + 1_000, "k1", 5, "old"), record("a2", base + 2_000, "k1", 7),
                                         record("a3", base + 3_000, "k2", 11, "old")])
    before = declared(incoming, S)
    source = open_source(before, lake)
    output = before.outputs[0]
    windows_path = lake.table_path(output.table)
    closes = CloseStore(lake.panes(), output.asset)
    drain(lambda: spark, source)
    materialize_windows(spark, before, output, [w0], w0.end_ms, closes, source.raw_path, windows_path)
    w0_rows = read_rows(windows_path, ["window_start", "key", "n", "total", "pane", "raw_version"])
    assert w0_rows == [(utc(base), "k1", 2, 12, 1, 1), (utc(base), "k2", 1, 11, 1, 1)]

    after = declared(incoming, S_NOTE, totals_with_note)
    write_records(incoming / "2.jsonl", [record("b1", w1.start_ms + 1_000, "k1", 1, "new-1"),
                                         record("b2", w1.start_ms + 2_000, "k1", 2),
                                         record("b3", w1.start_ms + 3_000, "k2", 3, "new-3")])
    results = drain(lambda: spark, open_source(after, lake))

    assert [(r.batch_id, r.inserted, r.dead_lettered_total) for r in results] == [(2, 3, 0)]
    raw = DeltaTable(source.raw_path)
    assert raw.schema().fields[-1].name == "note" and raw.schema().fields[-1].nullable  # appended, nullable
    assert read_rows(source.raw_path, ["record_id", "key", "value", "note"]) == [
        ("a1", "k1", 5, None), ("a2", "k1", 7, None), ("a3", "k2", 11, None),  # old rows read NULL
        ("b1", "k1", 1, "new-1"), ("b2", "k1", 2, None), ("b3", "k2", 3, "new-3"),
    ]
    # w1 closes under the new declaration; w0 is recomputed (a backfill) from its version pinned before the change.
    done = materialize_windows(spark, after, after.outputs[0], [w0, w1], w1.end_ms, closes, source.raw_path,
                               windows_path)
    assert read_rows(windows_path, WINDOW_ROWS) == [
        (utc(base), "k1", 2, 12, None, 1, 1), (utc(base), "k2", 1, 11, None, 1, 1),
        (utc(w1.start_ms), "k1", 2, 3, "new-1", 1, 3), (utc(w1.start_ms), "k2", 1, 3, "new-3", 1, 3),
    ]
    # The asset check recomputing both windows agrees (the table's new column sits at its end).
    assert output_mismatches(spark, after, after.outputs[0], source.raw_path, windows_path, done) == []


CHANGES = [
    # (declared schema, field, the table's type, the declared type) against a table made for S_NOTE
    ("key STRING NOT NULL, value DOUBLE NOT NULL, note STRING", "value", "BIGINT NOT NULL", "DOUBLE NOT NULL"),
    ("key STRING NOT NULL, value BIGINT NOT NULL", "note", "STRING", "nothing (dropped or renamed)"),
    ("key STRING NOT NULL, value BIGINT NOT NULL, remark STRING", "note", "STRING", "nothing (dropped or renamed)"),
    ("key STRING NOT NULL, value BIGINT NOT NULL, note STRING NOT NULL", "note", "STRING", "STRING NOT NULL"),
    ("key STRING NOT NULL, value BIGINT, note STRING", "value", "BIGINT NOT NULL", "BIGINT"),
    (f"{S_NOTE}, region STRING NOT NULL", "region", "no such column (old rows have no value)", "STRING NOT NULL"),
]


@pytest.mark.engine_paths
def test_any_other_change_is_refused_at_load_and_changes_no_table(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = tmp_path / "in"
    write_records(incoming / "1.jsonl", [record("a1", 1_763_720_000_000, "k1", 5, "x")])
    source = open_source(declared(incoming, S_NOTE), LakeResource(home=str(home)))
    drain(lambda: spark, source)
    version, schema = table_version(source.raw_path), DeltaTable(source.raw_path).schema().to_json()
    monkeypatch.syspath_prepend(str(tmp_path))

    for index, (change, field, held, said) in enumerate(CHANGES):
        # The code location loads a user's module declaring the changed schema.
        (tmp_path / f"changed_{index}.py").write_text(
            "from onceflow import FileSource, Pipeline\n"
            f"PIPELINES = [Pipeline(name='evolving', schema={change!r}, source=FileSource(directory={str(incoming)!r}, "
            "id_field='event_id', timestamp_field='event_time'))]\n"
        )
        monkeypatch.setenv("ONCEFLOW_PIPELINES", f"changed_{index}")
        with pytest.raises(DeclarationError) as refused:
            definitions()
        assert str(refused.value).startswith(
            f"pipeline 'evolving': schema: field {field!r}: the table raw/evolving holds {held}, the declaration "
            f"says {said}. "
        ), change
        assert "declare the pipeline under a new name" in str(refused.value)
        assert table_version(source.raw_path) == version
        assert DeltaTable(source.raw_path).schema().to_json() == schema
    assert read_rows(source.raw_path, ["record_id", "key", "value", "note"]) == [("a1", "k1", 5, "x")]


def test_two_processes_loading_a_new_field_at_once_both_load(tmp_path: Path, home: Path) -> None:
    incoming = tmp_path / "in"
    ensure_raw_table(LakeResource(home=str(home)).table_path("raw/evolving"), declared(incoming, S))
    start = time.time() + 6  # both processes have imported by then; they check the table at the same moment
    script = (
        "import sys, time\n"
        "from tests.test_schema_evolution import S_NOTE, declared\n"
        "from onceflow.orchestration.pipelines.table_check import check_raw_tables\n"
        "from onceflow.resources.lake import LakeResource\n"
        "from pathlib import Path\n"
        "pipeline = declared(Path(sys.argv[1]), S_NOTE)\n"
        "time.sleep(max(0, float(sys.argv[2]) - time.time()))\n"
        "check_raw_tables([pipeline], LakeResource(home=sys.argv[3]))\n"
        "print('loaded')\n"
    )
    env = {**os.environ, "ONCEFLOW_HOME": str(home)}
    runs = [subprocess.Popen([sys.executable, "-c", script, str(incoming), str(start), str(home)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = [run.communicate(timeout=120) for run in runs]

    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outcomes]
    assert [out.strip() for out, _ in outcomes] == ["loaded", "loaded"]
    fields = DeltaTable(str(home / "lake" / "raw" / "evolving")).schema().fields
    assert [f.name for f in fields].count("note") == 1 and fields[-1].name == "note" and fields[-1].nullable


@pytest.mark.engine_paths
def test_an_append_of_rows_without_the_tables_schema_writes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    create_table_once(path, parse_schema("record_id STRING NOT NULL, amount INT"), table_properties(3600))
    rows = spark.range(3).selectExpr("concat('r', id) AS record_id", "CAST(id AS INT) AS amount")
    assert append_once(rows, path, "a", 1, {"onceflow_source": "a", "onceflow_batch": 1})
    files = sorted(p.name for p in Path(path).glob("*.parquet"))

    wider = spark.range(3, 6).selectExpr("concat('r', id) AS record_id", "id AS amount")  # BIGINT, not INT
    more = spark.range(6, 9).selectExpr("concat('r', id) AS record_id", "CAST(id AS INT) AS amount", "'x' AS note")
    for batch, df in ((2, wider), (3, more)):
        with pytest.raises(Exception, match=r"amount|note"):
            append_once(df, path, "a", batch, {"onceflow_source": "a", "onceflow_batch": batch})

    assert table_version(path) == 1 and DeltaTable(path).transaction_version("a") == 1
    assert sorted(p.name for p in Path(path).glob("*.parquet")) == files  # no file written for another schema
    assert read_rows(path, ["record_id", "amount"]) == [("r0", 0), ("r1", 1), ("r2", 2)]


def test_what_counts_as_a_change_of_a_record_schema_and_of_a_transforms_output() -> None:
    table = parse_schema("a INT NOT NULL, s STRUCT<x: INT>, l ARRAY<STRUCT<x: INT>>")
    added, problems = differences(table, parse_schema("l ARRAY<STRUCT<x: INT>>, a INT NOT NULL, s STRUCT<x: INT>, "
                                                      "n STRING"), strict=True)
    assert ([f.name for f in added], problems) == (["n"], [])  # order is free, a new nullable field is added
    _, problems = differences(table, parse_schema("a INT NOT NULL, s STRUCT<x: INT, y: INT>, l ARRAY<STRUCT<x: INT, "
                                                  "y: INT>>"), strict=True)
    assert problems == [Mismatch("s", "STRUCT<x: INT>", "STRUCT<x: INT, y: INT>"),
                        Mismatch("l", "ARRAY<STRUCT<x: INT>>", "ARRAY<STRUCT<x: INT, y: INT>>")]  # no nested additions
    # A transform's output: Spark infers nullability, so only types count and new columns are added nullable.
    added, problems = differences(table, parse_schema("a INT, s STRUCT<x: INT NOT NULL>, l ARRAY<STRUCT<x: INT>>, "
                                                      "c BIGINT NOT NULL"), strict=False)
    assert ([(f.name, f.nullable) for f in added], problems) == ([("c", True)], [])
    _, problems = differences(table, parse_schema("a BIGINT, s STRUCT<x: INT>"), strict=False)
    assert problems == [Mismatch("a", "INT NOT NULL", "BIGINT"), Mismatch("l", "ARRAY<STRUCT<x: INT>>",
                                                                          "nothing (dropped or renamed)")]
