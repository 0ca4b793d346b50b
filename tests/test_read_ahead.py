"""The next batch read while a batch commits (`onceflow.jobs.sources.read_ahead`): used only for the very plan it
was read for; a file that changed meanwhile, or another run that planned the batch first, drops it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.workload import make_events
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import builtin, drain, events_from_files
from tests.test_ingest_files import write_jsonl

START_MS = 1_763_720_000_000


@pytest.fixture
def incoming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = events_from_files(tmp_path, monkeypatch, max_files=1)
    events = make_events(90, START_MS, 60_000, seed=5, prefix="ra")
    for n in range(3):
        write_jsonl(directory / f"{n}.jsonl", [e.json_line() for e in events[n * 30:(n + 1) * 30]])
    return directory


def _ids(source) -> list[str]:
    return [row[0] for row in read_rows(source.raw_path, ["record_id"])]


@pytest.mark.engine_paths
def test_the_next_batch_read_ahead_is_the_one_it_records(spark: SparkSession, home: Path, incoming: Path) -> None:
    source = open_source(builtin("events"), LakeResource(home=str(home)))
    first = run_micro_batch(lambda: spark, source)
    proposal = source.read_ahead.proposal
    assert first is not None and proposal is not None and not first.read_ahead
    assert (proposal.batch_id, [f.path for f in proposal.files]) == (first.batch_id + 1, ["1.jsonl"])
    assert source.checkpoints.get_plan(proposal.batch_id) is None  # nothing is recorded for a read ahead

    second = run_micro_batch(lambda: spark, source)
    assert second is not None and second.inserted == 30 and second.balances() and second.read_ahead
    assert source.checkpoints.get_plan(second.batch_id) == proposal  # recorded as it was read


@pytest.mark.engine_paths
def test_a_file_changed_after_it_was_read_ahead_is_read_again(
    spark: SparkSession, home: Path, incoming: Path
) -> None:
    source = open_source(builtin("events"), LakeResource(home=str(home)))
    assert run_micro_batch(lambda: spark, source) is not None
    assert source.read_ahead.proposal is not None
    source.read_ahead.settle()  # read whole: what it holds is the file as it was
    later = make_events(5, START_MS, 60_000, seed=6, prefix="late")
    # Rewritten before its batch is planned (a producer finishing the file): the plan fingerprints the new bytes.
    with (incoming / "1.jsonl").open("a") as file:
        file.writelines(f"{e.json_line()}\n" for e in later)

    results = drain(lambda: spark, source)
    assert [r.inserted for r in results] == [35, 30] and all(r.balances() for r in results)
    assert not results[0].read_ahead  # dropped: its plan fingerprints the file's new bytes
    ids = _ids(source)
    assert len(ids) == len(set(ids)) == 95 and {e.event_id for e in later} <= set(ids)


@pytest.mark.engine_paths
def test_a_batch_another_run_planned_first_drops_what_was_read_ahead(
    spark: SparkSession, home: Path, incoming: Path
) -> None:
    lake = LakeResource(home=str(home))
    ours, theirs = open_source(builtin("events"), lake), open_source(builtin("events"), lake)
    assert run_micro_batch(lambda: spark, ours) is not None
    ahead = ours.read_ahead.proposal
    assert ahead is not None
    # Another run (a retry Dagster started) plans and commits that batch first, a moment later.
    taken = run_micro_batch(lambda: spark, theirs)
    assert taken is not None and taken.batch_id == ahead.batch_id
    assert theirs.checkpoints.get_plan(ahead.batch_id) != ahead

    results = drain(lambda: spark, ours)
    assert [(r.batch_id, r.inserted) for r in results] == [(ahead.batch_id + 1, 30)]
    ids = _ids(ours)
    assert len(ids) == len(set(ids)) == 90
