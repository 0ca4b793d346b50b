"""Concurrent writers of one raw table: two attempts at one batch, two app ids with one record, and a reset while
a run is in flight. Outcomes are read back with delta-rs; counts must equal the rows really written."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test
from pyspark.sql import SparkSession

from onceflow.jobs.ingest import batch_commit
from onceflow.jobs.ingest import batch_ingest as ingest
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.run_worker import worker_tags
from onceflow.jobs.sources.checkpoint import EpochStore
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.workload import expected_raw, make_events
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import builtin, events_from_files
from tests.test_ingest_files import write_jsonl

RAW = ["record_id", "event_time", "key", "value"]
START_MS = 1_763_720_000_000


def commits_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interleave two concurrent attempts the way a lost race needs, every time: each attempt's first append
    waits until both have decided what to write (the batch found uncommitted, its rows found new), then the first
    to arrive commits, and the other writes only once that commit is in."""
    arrived, committed, lock = threading.Barrier(2, timeout=180), threading.Event(), threading.Lock()
    turns: list[int] = []
    waited = threading.local()

    def in_turn(append: Callable[..., bool]) -> Callable[..., bool]:
        def append_in_turn(*args: Any, **kwargs: Any) -> bool:
            if getattr(waited, "done", False):  # a retry of the same attempt: no more waiting
                return append(*args, **kwargs)
            waited.done = True
            arrived.wait()
            with lock:
                turns.append(threading.get_ident())
                second = len(turns) > 1
            if second:
                committed.wait(180)
            try:
                return append(*args, **kwargs)
            finally:
                committed.set()

        return append_in_turn

    for module in (ingest, batch_commit):
        monkeypatch.setattr(module, "append_once", in_turn(module.append_once))


def run_together(spark: SparkSession, sources: list[SourceRuntime]) -> list:
    """One micro-batch of each source, in threads at once; every result, or the first error raised."""
    results: list = [None] * len(sources)

    def run(i: int) -> None:
        try:
            results[i] = run_micro_batch(lambda: spark, sources[i])
        except BaseException as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sources))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@pytest.mark.engine_paths
@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_two_concurrent_attempts_at_one_batch_count_its_rows_once(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, delivery: str
) -> None:
    monkeypatch.setenv("ONCEFLOW_DELIVERY", delivery)
    incoming = events_from_files(tmp_path, monkeypatch, max_files=1)
    events = make_events(120, START_MS, 600_000, seed=41, prefix="c")
    write_jsonl(incoming / "1.jsonl", [e.json_line() for e in events])
    lake = LakeResource(home=str(home))
    attempts = [open_source(builtin("events"), lake) for _ in range(2)]
    commits_in_turn(monkeypatch)

    results = run_together(spark, attempts)

    won, lost = sorted(results, key=lambda r: r.replayed)
    assert (won.batch_id, won.inserted, won.replayed, won.lost_race) == (1, 120, False, False)
    # The loser wrote nothing: it says so, shows the winner's figures, and adds nothing to the totals.
    assert (lost.batch_id, lost.inserted, lost.replayed, lost.lost_race) == (1, 120, True, True)
    assert won.balances() and lost.balances()
    assert read_rows(attempts[0].raw_path, RAW) == expected_raw(events)
    totals = attempts[0].checkpoints.load().totals
    assert (totals["received"], totals["inserted"]) == (120, 120)


@pytest.mark.engine_paths
def test_two_app_ids_racing_one_record_commit_it_once(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset's new epoch overlapping a run of the old one: two app ids take the same file at once, each finds
    its records new, and both commit. The second commit must see the first's IDs, whatever its app id."""
    incoming = events_from_files(tmp_path, monkeypatch, max_files=1)
    events = make_events(80, START_MS, 600_000, seed=42, prefix="r")
    write_jsonl(incoming / "1.jsonl", [e.json_line() for e in events])
    lake = LakeResource(home=str(home))
    old = open_source(builtin("events"), lake)
    EpochStore(lake.epochs()).advance("events", first_batch=1)  # as a reset with nothing committed does
    new = open_source(builtin("events"), lake)
    assert (old.app_id, new.app_id) == ("events/files", "events/files@1")
    commits_in_turn(monkeypatch)

    results = run_together(spark, [old, new])

    assert read_rows(old.raw_path, RAW) == expected_raw(events)  # each record once
    assert sorted(r.inserted for r in results) == [0, 80]
    assert sorted(r.duplicates_committed for r in results) == [0, 80] and all(r.balances() for r in results)


def test_reset_refuses_while_a_micro_batch_run_is_in_flight(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events_from_files(tmp_path, monkeypatch, max_files=1)
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    epochs = EpochStore(LakeResource(home=str(home)).epochs())

    def reset() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "onceflow", "reset", "events"], capture_output=True,
                              text=True, timeout=120)

    with dg.DagsterInstance.get() as instance:
        run = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.STARTED)
        instance.add_run_tags(run.run_id, worker_tags(run.run_id, os.getpid()))  # its worker: this live process
        refused = reset()
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"a micro-batch run of events is in flight (run {run.run_id} is STARTED)" in refused.stdout
        assert epochs.current("events") == 0

        instance.report_run_failed(run)  # it ended
        done = reset()
    assert done.returncode == 0, done.stdout + done.stderr
    assert epochs.current("events") == 1
