"""`onceflow verify` reconciles from independent facts, so it fails when the tables, the dead letters or the
published files are wrong — not only when nothing is wrong."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sinks import output_sinks, publish_closed
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.cli.verify import verify
from onceflow.orchestration.workload import MALFORMED, Event
from onceflow.resources.lake import LakeResource
from tests.pipelines import drain
from tests.test_windows import file_pipeline, write_events


@pytest.fixture(scope="module")
def built(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory):
    """Events over files, with retries and bad lines, two windows closed and published: verify passes. Built once;
    each test gets its own copy to damage."""
    root = tmp_path_factory.mktemp("verify")
    base = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000
    events = [Event(f"v{i}", base + i * 3_000, f"k{i % 3}", i) for i in range(40)]
    closer = Event("closer", base + 5 * 60_000, "k0", 1)
    lines = [e.json_line() for e in [*events, *events[:5], closer]]
    # A boolean is no DECIMAL: wrong_type (a number for the STRING key would be its text, as Spark reads it).
    lines += [json.dumps({"event_id": f"bad-{i}", "event_time": base + 1000, "key": "k0", "value": True})
              for i in range(3)]
    write_events(root / "in" / "1.jsonl", [])
    (root / "in" / "1.jsonl").write_text("".join(f"{line}\n" for line in lines))
    pipeline = file_pipeline(root / "in")
    output = pipeline.outputs[0]
    lake = LakeResource(home=str(root / "home"))
    source = open_source(pipeline, lake)
    drain(lambda: spark, source)
    windows = [Window(base, base + 60_000), Window(base + 60_000, base + 120_000)]
    results = materialize_windows(spark, pipeline, output, windows, base + 4 * 60_000, CloseStore(
        lake.panes(), output.asset), source.raw_path, lake.table_path(output.table))
    sinks = output_sinks(output, lake.sink_root(), lake.staging_root(), None)
    publish_closed(spark, CommitContext(CommitStore(lake.commits())), output, sinks, lake.table_path(output.table),
                   results, "run", "run")
    return pipeline, root / "home", windows


@pytest.fixture
def verified(built, spark: SparkSession, home: Path):
    """A copy of the built home (tables, checkpoints, panes, commits, published files) that verify passes on."""
    pipeline, built_home, windows = built
    shutil.copytree(built_home, home, dirs_exist_ok=True)
    lake = LakeResource(home=str(home))
    assert verify(spark, [pipeline], lake)
    return pipeline, lake, open_source(pipeline, lake), windows


def test_verify_passes_on_an_exact_result_and_names_what_it_checked(verified, spark, capsys) -> None:
    pipeline, lake, _, windows = verified
    assert verify(spark, [pipeline], lake)
    out = capsys.readouterr().out
    assert "events: exactly-once holds" in out
    (row,) = [line.split() for line in out.splitlines() if line.startswith(windows[0].key)]
    # received 28 = 20 inserted + 5 duplicates (a producer resent 5) + 0 late + 3 dead letters; 3 keys; published
    assert row == [windows[0].key, "28", "20", "5", "0", "3", "3", "1", "yes", "ok"]


def test_verify_fails_on_a_record_twice_in_raw(verified, spark, capsys) -> None:
    pipeline, lake, source, _ = verified
    spark.sql(f"INSERT INTO delta.`{source.raw_path}` SELECT * FROM delta.`{source.raw_path}` WHERE record_id = 'v3'")
    assert not verify(spark, [pipeline], lake)
    assert "1 record IDs twice in raw: v3" in capsys.readouterr().out


def test_verify_fails_on_a_record_lost_from_raw(verified, spark, capsys) -> None:
    pipeline, lake, source, windows = verified
    spark.sql(f"DELETE FROM delta.`{source.raw_path}` WHERE record_id = 'v25'")  # in the second window
    assert not verify(spark, [pipeline], lake)
    out = capsys.readouterr().out
    assert f"MISMATCH in {windows[1].key}" in out and "1 record IDs lost (landed, held nowhere): v25" in out


def test_verify_fails_on_a_dead_letter_twice(verified, spark, capsys) -> None:
    pipeline, lake, source, _ = verified
    path = source.dead_letter_path
    spark.sql(f"INSERT INTO delta.`{path}` SELECT * FROM delta.`{path}` WHERE record_id = 'bad-1'")
    assert not verify(spark, [pipeline], lake)
    out = capsys.readouterr().out
    assert "1 record IDs twice in the dead letters: bad-1" in out and "exactly-once VIOLATED" in out


def test_verify_fails_on_a_lost_dead_letter(verified, spark, capsys) -> None:
    pipeline, lake, source, _ = verified
    spark.sql(f"DELETE FROM delta.`{source.dead_letter_path}` WHERE record_id = 'bad-2'")
    assert not verify(spark, [pipeline], lake)
    assert "1 record IDs lost (landed, held nowhere): bad-2" in capsys.readouterr().out


def test_verify_fails_on_a_published_file_that_differs_from_the_table(verified, spark, home: Path, capsys) -> None:
    pipeline, lake, _, windows = verified
    (part,) = (home / "published" / "event_counts" / f"window={windows[1].key}" / "pane=1").glob("part-*.jsonl")
    rows = [json.loads(line) for line in part.read_text().splitlines()]
    rows[0]["count"] += 1
    part.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert not verify(spark, [pipeline], lake)
    assert f"MISMATCH in {windows[1].key}" in capsys.readouterr().out


def test_verify_fails_on_a_window_row_the_transform_does_not_give(verified, spark, capsys) -> None:
    pipeline, lake, _, windows = verified
    table = lake.table_path(pipeline.outputs[0].table)
    spark.sql(f"UPDATE delta.`{table}` SET count = count + 1 WHERE window_start = timestamp_millis({windows[0].start_ms})")
    assert not verify(spark, [pipeline], lake)
    assert f"MISMATCH in {windows[0].key}" in capsys.readouterr().out


def test_malformed_workload_reasons_are_the_generic_ones() -> None:
    assert {reason for reason, _, _ in MALFORMED} <= {
        "not_json", "missing_field", "wrong_type", "out_of_range", "bad_event_time", "oversized"
    }
