"""The `event_counts` asset through Dagster's command line: repeated materializations, backfills, crashes."""

from __future__ import annotations

import json
import time
import uuid
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest
from google.cloud import bigquery
from pyspark.sql import SparkSession

from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.panes import CloseStore, PaneClose, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import builtin, dagster_materialize, drain
from tests.test_windows import WINDOW_ROWS, expected_rows, five_window_workload, minute_base, write_events

ALL_COLUMNS = [*WINDOW_ROWS, "window_end", "raw_version"]


@pytest.fixture
def ingested(spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch):
    """Five windows of on-time events ingested through the file source; the watermark closes some of them."""
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(tmp_path / "in"))
    base = minute_base()
    on_time, _, _ = five_window_workload(base)
    write_events(tmp_path / "in" / "1.jsonl", on_time)
    pipeline = builtin("events")
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    drain(lambda: spark, source)
    watermark = source_watermark_ms(source.checkpoints.load())
    assert watermark is not None
    windows = [Window(base + w * 60_000, base + (w + 1) * 60_000) for w in range(5)]
    closed = [w.end_ms + pipeline.outputs[0].allowed_lateness_s * 1000 <= watermark for w in windows]
    assert closed[0] and not closed[-1]  # some windows final, some still open
    return pipeline, lake, base, on_time, windows, closed


def expected_table(base: int, on_time: list, closed: list[bool], indexes: range) -> list[tuple]:
    rows = []
    for w in indexes:
        pane, timing = (1, "on_time") if closed[w] else (0, "early")
        rows += expected_rows(base, on_time, range(w, w + 1), pane, timing)
    return sorted(rows)


def published_rows(home: Path, window: Window) -> list[tuple]:
    """(key, count, sum_value, pane) of a window's final pane in the file sink."""
    files = sorted((home / "published" / "event_counts" / f"window={window.key}").glob("pane=*/part-*.jsonl"))
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    return sorted((r["key"], r["count"], Decimal(r["sum_value"]), r["pane"]) for r in rows)


def table_rows(windows_path: str, window: Window) -> list[tuple]:
    return [
        (key, count, total, pane)
        for start, key, count, total, pane, _ in read_rows(windows_path, WINDOW_ROWS)
        if int(start.timestamp() * 1000) == window.start_ms
    ]


def bigquery_rows(client: bigquery.Client, dataset: str, window: Window) -> list[tuple]:
    sql = (f"SELECT key, count, sum_value, pane FROM `{client.project}.{dataset}.event_counts` "
           f"WHERE window_start = TIMESTAMP_MILLIS({window.start_ms})")
    return sorted(tuple(row.values()) for row in client.query_and_wait(sql))


def assert_published(
    home: Path, windows_path: str, windows: list[Window], closed: list[bool], client: bigquery.Client, dataset: str
) -> None:
    """Closed windows are published once, in files and BigQuery, exactly as the window table holds them; open
    windows are not published at all."""
    for window, is_closed in zip(windows, closed, strict=True):
        expected = table_rows(windows_path, window) if is_closed else []
        assert not is_closed or expected
        assert published_rows(home, window) == expected
        assert bigquery_rows(client, dataset, window) == expected
    store = CommitStore(LakeResource(home=str(home)).commits())
    assert store.unfinished() == [] and len(store.sequences()) == sum(closed)


@pytest.fixture
def dataset(bigquery_client: bigquery.Client) -> str:
    return bigquery_client.create_dataset(f"test_{uuid.uuid4().hex[:12]}").dataset_id


@pytest.mark.longest
def test_materializing_a_window_then_backfilling_twice_leave_the_table_identical(
    ingested, home: Path, bigquery_client: bigquery.Client, dataset: str
) -> None:
    """Window 1 is materialized three times (alone, then in each backfill) and every window of the range twice."""
    pipeline, lake, base, on_time, windows, closed = ingested
    windows_path = lake.table_path(pipeline.outputs[0].table)
    settings = {
        "events_source": "files", "events_dir": str(Path(pipeline.source.directory)),
        "bigquery_project": bigquery_client.project, "bigquery_dataset": dataset,
    }

    run = dagster_materialize(str(home), windows[1].key, **settings)
    assert run.returncode == 0, run.stderr[-3000:]
    assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(1, 2))
    once = read_rows(windows_path, ALL_COLUMNS)

    backfills = []
    for _ in range(2):
        run = dagster_materialize(str(home), f"{windows[0].key}...{windows[4].key}", **settings)
        assert run.returncode == 0, run.stderr[-3000:]
        backfills.append(read_rows(windows_path, ALL_COLUMNS))

    assert backfills[0] == backfills[1]
    assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(5))
    assert [r for r in backfills[0] if r in once] == once  # window 1 kept its pinned pane
    assert_published(home, windows_path, windows, closed, bigquery_client, dataset)


@pytest.mark.parametrize(
    "crash_at", ["window.after_close", "window.after_merge", "commit.after_write_sequence", "commit.after_step#2"]
)
def test_window_crash_then_rerun_gives_the_same_result(
    ingested, spark: SparkSession, home: Path, crash_at: str, bigquery_client: bigquery.Client, dataset: str
) -> None:
    pipeline, lake, base, on_time, windows, closed = ingested
    windows_path = lake.table_path(pipeline.outputs[0].table)
    settings = {
        "events_source": "files", "events_dir": str(Path(pipeline.source.directory)),
        "bigquery_project": bigquery_client.project, "bigquery_dataset": dataset,
    }

    crashed = dagster_materialize(str(home), windows[0].key, crash_at, **settings)
    assert f"crash injected at {crash_at.split('#')[0]}" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    closes = CloseStore(lake.panes(), pipeline.outputs[0].asset)
    first_close = closes.latest(windows[0])
    assert first_close is not None and first_close.pane == 1  # the close was recorded before the crash

    rerun = dagster_materialize(str(home), windows[0].key, **settings)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(1))
    assert closes.latest(windows[0]) == first_close  # closed once, at one raw version
    assert {r[-1] for r in read_rows(windows_path, ALL_COLUMNS)} == {first_close.raw_version}
    # An in-process recompute agrees with what the Dagster runs left behind.
    before = read_rows(windows_path, ALL_COLUMNS)
    watermark = first_close.watermark_ms
    materialize_windows(
        spark, pipeline, pipeline.outputs[0], [windows[0]], watermark, closes, lake.table_path(pipeline.raw_table),
        windows_path,
    )
    assert read_rows(windows_path, ALL_COLUMNS) == before
    assert_published(home, windows_path, windows[:1], closed[:1], bigquery_client, dataset)


def test_a_backfill_across_the_retention_fails_only_the_expired_window(ingested, home: Path, tmp_path: Path) -> None:
    pipeline, lake, base, on_time, windows, closed = ingested
    output = pipeline.outputs[0]
    windows_path = lake.table_path(output.table)
    assert closed[:3] == [True] * 3
    # Window 0 was closed long ago: its pinned raw version is beyond the retention the tables keep.
    long_ago = int(time.time() * 1000) - pipeline.retention_s * 1000 - 3_600_000
    CloseStore(lake.panes(), output.asset).close(
        windows[0], PaneClose(window_start_ms=windows[0].start_ms, pane=1, timing="on_time", raw_version=1,
                              max_batch_id=1, watermark_ms=long_ago, closed_at_ms=long_ago))
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()

    run = dagster_materialize(str(home), f"{windows[0].key}...{windows[2].key}", dagster_home=str(dagster_home),
                              events_source="files", events_dir=str(Path(pipeline.source.directory)))

    assert run.returncode != 0
    assert f"PinnedInputExpired: event_counts window {windows[0].key} pane 1 was closed at raw version 1" in (
        run.stdout + run.stderr)
    assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(1, 3))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        materialized = {
            w.key: instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(output.asset), asset_partitions=[w.key]), limit=5
            ).records
            for w in windows[:3]
        }
    assert [len(materialized[w.key]) for w in windows[:3]] == [0, 1, 1]
    for w in windows[1:3]:
        metadata = materialized[w.key][0].asset_materialization.metadata
        assert (metadata["pane"].value, metadata["records"].value) == (1, 12)
