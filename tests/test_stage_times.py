"""Where a batch's time went: every batch says, by stage, on each path a batch takes (exactly-once with and without
the ID filters, at-least-once), and its Dagster metadata carries the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.sources import FileSource
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.ingest.stage_times import STAGES, StageTimes
from onceflow.jobs.ingest_job import ingest_metadata
from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings
from tests.delta_reader import read_rows

START_MS = 1_763_720_000_000
ALWAYS = {"read", "read_wait", "dead_letters", "write", "checkpoint", "batch"}


def test_stage_times_add_up_by_stage_and_refuse_an_unknown_one() -> None:
    times = StageTimes()
    times.add("write", 0.25)
    times.add("write", 0.5)
    times.add("read", 0.125)
    assert times.ms == {"write": 750.0, "read": 125.0}
    assert str(times) == "read 125 ms, write 750 ms"  # in the order of `STAGES`
    with pytest.raises(ValueError, match=r"'parse'.*one of read, read_wait"):
        times.add("parse", 1.0)


def _files(directory: Path) -> None:
    """Two files (a batch each): 40 records, 10 of them again, a line that is no JSON and a record without `key`."""
    directory.mkdir()
    for n in range(2):
        records = [{"event_id": f"e{n}-{i}", "event_time": START_MS + i * 1000, "key": f"k{i % 3}", "value": i}
                   for i in range(40)]
        lines = [json.dumps(r) for r in records + records[:10]]
        lines += [f'{{"event_id": "cut{n}', json.dumps({"event_id": f"bad{n}", "event_time": START_MS, "value": 1})]
        (directory / f"{n}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.engine_paths
@pytest.mark.parametrize(
    ("delivery", "id_filters", "stages"),
    [("exactly_once", True, ALWAYS | {"dedup"}), ("exactly_once", False, ALWAYS - {"write"} | {"dedup", "merge"}),
     ("at_least_once", True, ALWAYS)],
)
def test_every_batch_says_where_its_time_went(
    spark: SparkSession, tmp_path: Path, home: Path, delivery: str, id_filters: bool, stages: set[str]
) -> None:
    _files(tmp_path / "incoming")
    source = FileSource(directory=str(tmp_path / "incoming"), id_field="event_id", timestamp_field="event_time",
                        max_files=1)
    pipeline = resolve(Pipeline(name="timed", source=source, schema="key STRING NOT NULL, value BIGINT NOT NULL",
                                delivery=delivery), load_settings())
    runtime = open_source(pipeline, LakeResource(home=str(home), id_filters=id_filters))
    results: list[IngestResult] = []
    while (result := run_micro_batch(lambda: spark, runtime)) is not None:
        results.append(result)

    assert [(r.inserted, r.dead_lettered_new) for r in results] == [
        (40 if delivery == "exactly_once" else 50, 2)] * 2
    assert len(read_rows(runtime.raw_path, ["record_id"])) == sum(r.inserted for r in results)
    for result in results:
        ms = result.times.ms
        assert set(ms) == stages
        assert all(value > 0 for value in ms.values()), ms
        # Every stage of the batch happened inside it; its read too, unless it began beside the batch before.
        inside = {stage: value for stage, value in ms.items() if stage != "read" or not result.read_ahead}
        assert max(inside.values()) == ms["batch"], ms
        if not result.read_ahead:
            assert ms["read_wait"] >= ms["read"], ms  # waited for the whole read
        metadata = ingest_metadata(result)
        assert {key: metadata[key] for key in metadata if key.endswith("_ms") and key[:-3] in STAGES} == {
            f"{stage}_ms": round(value, 1) for stage, value in ms.items()}
