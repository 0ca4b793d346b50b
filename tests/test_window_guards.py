"""A window never mixes panes: a stale pane changes nothing in a window that holds a newer one, whatever its
transform keeps or drops, and the check for a pane merged while a newer one committed runs whenever another commit
came between; a window whose pinned input expired fails alone, the others of its run go on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import Window as SparkWindow
from pyspark.sql import functions as F

from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.windows import merge
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.workload import Event
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import drain
from tests.test_windows import LATENESS_MS, file_pipeline, minute_base, write_events


def top_two(records: DataFrame) -> DataFrame:
    """The two keys with the most records (ties by key): not monotone, a late record can push a key out."""
    counted = records.groupBy("key").agg(F.count("*").alias("count"))
    rank = F.row_number().over(SparkWindow.orderBy(F.desc("count"), F.asc("key")))
    return counted.withColumn("rank", rank).filter("rank <= 2").drop("rank")


@pytest.mark.engine_paths
def test_a_stale_pane_changes_nothing_in_a_window_holding_a_newer_one(
    spark: SparkSession, tmp_path: Path, home: Path
) -> None:
    base = minute_base()
    pipeline = file_pipeline(tmp_path / "in", late_policy="refire")
    output = dataclasses.replace(pipeline.outputs[0], transform=top_two)
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    windows_path = lake.table_path(output.table)
    window = Window(base, base + 60_000)
    closes = CloseStore(lake.panes(), output.asset)
    closed = window.end_ms + LATENESS_MS

    on_time = [Event(f"a{i}", base + i * 1000, key, 1) for i, key in enumerate(["k0"] * 3 + ["k1"] * 2 + ["k2"])]
    write_events(tmp_path / "in" / "1.jsonl", on_time)
    drain(lambda: spark, source)
    (first,) = materialize_windows(spark, pipeline, output, [window], closed, closes, source.raw_path, windows_path)
    assert (first.pane, read_rows(windows_path, ["key", "count", "pane"])) == (1, [("k0", 3, 1), ("k1", 2, 1)])
    pane_one = closes.latest(window)

    # Late records make k2 the top key: pane 2 drops k1.
    write_events(tmp_path / "in" / "2.jsonl", [Event(f"late{i}", base + 30_000 + i, "k2", 1) for i in range(4)])
    drain(lambda: spark, source)
    (second,) = materialize_windows(spark, pipeline, output, [window], closed, closes, source.raw_path, windows_path)
    newer = read_rows(windows_path, ["window_start", "key", "count", "pane", "timing", "raw_version"])
    assert second.pane == 2 and [r[1:5] for r in newer] == [("k0", 3, 2, "late"), ("k2", 5, 2, "late")]

    # A run that read pane 1's close before pane 2 was closed commits after it: it must change nothing (its k1
    # would be a key pane 2 dropped, and a k0 of pane 1 would be a row of another pane).
    stale = CloseStore(lake.landing(), "stale-run")
    assert pane_one is not None
    stale.close(window, pane_one)
    materialize_windows(spark, pipeline, dataclasses.replace(output, late_policy="drop"), [window], closed, stale,
                        source.raw_path, windows_path)

    assert read_rows(windows_path, ["window_start", "key", "count", "pane", "timing", "raw_version"]) == newer


@pytest.mark.engine_paths
def test_the_pane_check_after_a_window_merge_runs_only_when_another_commit_came_between(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = minute_base()
    pipeline = file_pipeline(tmp_path / "in")
    output = pipeline.outputs[0]
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    windows_path = lake.table_path(output.table)
    window = Window(base, base + 60_000)
    closes = CloseStore(lake.panes(), output.asset)
    write_events(tmp_path / "in" / "1.jsonl", [Event(f"a{i}", base + i * 1000, f"k{i % 2}", 1) for i in range(5)])
    drain(lambda: spark, source)
    checked: list[str] = []
    check = merge._drop_older_panes
    monkeypatch.setattr(merge, "_drop_older_panes", lambda *args: checked.append(args[1]) or check(*args))

    def materialize() -> list[tuple]:
        materialize_windows(spark, pipeline, output, [window], None, closes, source.raw_path, windows_path)
        return read_rows(windows_path, ["key", "count", "pane"])

    assert materialize() == [("k0", 3, 0), ("k1", 2, 0)]
    assert checked == []  # the MERGE committed right after the version it began on: nothing came between

    read_version = merge.latest_version

    def then_another_commit(path: str) -> int:
        version = read_version(path)
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('another.writer' = '{version}')")
        return version

    monkeypatch.setattr(merge, "latest_version", then_another_commit)
    assert materialize() == [("k0", 3, 0), ("k1", 2, 0)]
    assert checked == [windows_path]
