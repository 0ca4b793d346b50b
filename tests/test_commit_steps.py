"""Commit steps and sequences end to end: files on local disk, the real BigQuery bigquery_emulator, real process crashes.

Every test checks outcomes exactly: the bytes of the published files, the rows of the BigQuery table, the high
watermark, and the recorded state of the sequence.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import pytest
from google.api_core.exceptions import NotFound
from google.cloud import bigquery

from onceflow.jobs.publish.bigquery_load import BigQueryLoad
from onceflow.jobs.publish.commit_records import DONE, FAILED, PENDING, QUARANTINED
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.pane_sequence import BigQueryTarget, PublishedPane, publish_pane
from onceflow.jobs.publish.sequence import (
    CommitSequence,
    FileFinalize,
    HighWatermark,
    run_sequence,
    sequence_id,
    step_from_dict,
)
from onceflow.jobs.publish.step import CommitContext, sha256_hex
from onceflow.jobs.windows.panes import Window
from onceflow.resources.bigquery_jobs import run_job
from onceflow.resources.emulators.bigquery import BigQueryEmulator
from onceflow.resources.faults import CRASH_EXIT_CODE
from onceflow.resources.object_store import LocalStore

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"
ASSET = "event_counts"
WINDOW_SCHEMA = (
    ("window_start", "TIMESTAMP"),
    ("window_end", "TIMESTAMP"),
    ("key", "STRING"),
    ("count", "INT64"),
    ("sum_value", "NUMERIC"),
    ("raw_version", "INT64"),
    ("pane", "INT64"),
    ("timing", "STRING"),
)
"""The `event_counts` window table's columns as BigQuery types: what these panes hold."""
KEY_COLUMNS = ("window_start", "key")
WINDOW = Window.from_partition_key("2026-11-21-10:05", 60)
OTHER_WINDOW = Window.from_partition_key("2026-11-21-10:06", 60)
PANE_1 = {"a": (3, "1.500000000"), "b": (1, "-2.250000000"), "c": (7, "12345678901234567890.123456789")}
PANE_2 = {"a": (4, "2.500000000"), "b": (1, "-2.250000000"), "d": (1, "0.000000001")}
# The steps of a sequence published with BigQuery and 2 rows per shard: 2 file shards, BigQuery, watermark.
STEP_COUNT = 4


@pytest.fixture
def target(bigquery_client: bigquery.Client) -> BigQueryTarget:
    """A BigQuery target in a new, empty dataset for one test."""
    dataset = bigquery_client.create_dataset(f"test_{uuid.uuid4().hex[:12]}").dataset_id
    return BigQueryTarget(bigquery_client.project, dataset, ASSET, KEY_COLUMNS)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def commit_store(home: Path) -> CommitStore:
    return CommitStore(LocalStore(home / "commits"))


def context(home: Path, bigquery_emulator: BigQueryEmulator | None = None) -> CommitContext:
    clients = (lambda project: bigquery_emulator.client(project)) if bigquery_emulator else None
    return CommitContext(commit_store(home), bigquery=clients)


def pane_rows(window: Window, pane: int, values: dict[str, tuple[int, str]]) -> list[dict[str, Any]]:
    start = datetime.fromtimestamp(window.start_ms / 1000, UTC)
    end = datetime.fromtimestamp(window.end_ms / 1000, UTC)
    timing = "on_time" if pane == 1 else "late"
    return [
        {"window_start": start, "window_end": end, "key": key, "count": count, "sum_value": Decimal(total),
         "raw_version": 10 + pane, "pane": pane, "timing": timing}
        for key, (count, total) in values.items()
    ]


def publish(
    home: Path, target: BigQueryTarget | None, window: Window = WINDOW, pane: int = 1,
    values: dict[str, tuple[int, str]] = PANE_1, max_attempts: int = 5,
) -> PublishedPane:
    return publish_pane(
        commit_store(home), asset=ASSET, window=window, pane=pane, rows=pane_rows(window, pane, values),
        schema=WINDOW_SCHEMA, sink_root=str(home / "published"), bigquery=target, rows_per_shard=2, max_attempts=max_attempts,
    )


def expected_lines(window: Window, pane: int, values: dict[str, tuple[int, str]]) -> list[str]:
    """The file sink's lines for a pane, written out independently of the code under test."""
    start = datetime.fromtimestamp(window.start_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    end = datetime.fromtimestamp(window.end_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    timing = "on_time" if pane == 1 else "late"
    return [
        f'{{"window_start":"{start}","window_end":"{end}","key":"{key}","count":{count},"sum_value":"{total}",'
        f'"raw_version":{10 + pane},"pane":{pane},"timing":"{timing}"}}'
        for key, (count, total) in sorted(values.items())
    ]


def expected_files(window: Window, pane: int, values: dict[str, tuple[int, str]]) -> dict[str, str]:
    lines = expected_lines(window, pane, values)
    directory = f"{ASSET}/window={window.key}/pane={pane}"
    return {
        f"{directory}/part-{shard:05d}.jsonl": "".join(line + "\n" for line in lines[shard * 2 : shard * 2 + 2])
        for shard in range((len(lines) + 1) // 2)
    }


def sink_files(home: Path) -> dict[str, str]:
    """Every file under the sink root, hidden temp files included."""
    root = home / "published"
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def table_rows(bigquery_client: bigquery.Client, target: BigQueryTarget) -> list[tuple[Any, ...]]:
    sql = (f"SELECT window_start, key, count, sum_value, pane, timing "
           f"FROM `{target.project}.{target.dataset}.{target.table}`")
    return sorted(tuple(row.values()) for row in bigquery_client.query_and_wait(sql))


def expected_rows(window: Window, pane: int, values: dict[str, tuple[int, str]]) -> list[tuple[Any, ...]]:
    start = datetime.fromtimestamp(window.start_ms / 1000, UTC)
    timing = "on_time" if pane == 1 else "late"
    return sorted((start, key, count, Decimal(total), pane, timing) for key, (count, total) in values.items())


def tables(bigquery_client: bigquery.Client, target: BigQueryTarget) -> list[str]:
    return sorted(t.table_id for t in bigquery_client.list_tables(target.dataset))


def assert_published_once(home: Path, bigquery_client: bigquery.Client, target: BigQueryTarget) -> None:
    assert sink_files(home) == expected_files(WINDOW, 1, PANE_1)
    assert table_rows(bigquery_client, target) == expected_rows(WINDOW, 1, PANE_1)
    assert tables(bigquery_client, target) == [ASSET]  # the staging table is gone
    assert commit_store(home).published_through(ASSET) == WINDOW.end_ms


CHILD = """
import sys
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.publish.sequence import run_sequence
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.resources.object_store import LocalStore

commits, endpoint, sequence_id, run_id = sys.argv[1:]
clients = lambda project: bigquery.Client(
    project=project, credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint})
print(run_sequence(CommitContext(CommitStore(LocalStore(commits)), bigquery=clients), sequence_id, run_id).outcome)
"""

CHILD_PUBLISH = """
import json, sys
from datetime import UTC, datetime
from decimal import Decimal
from onceflow.jobs.publish.pane_sequence import BigQueryTarget, publish_pane
from onceflow.jobs.windows.panes import Window
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.resources.object_store import LocalStore

home, spec = sys.argv[1:]
spec = json.loads(spec)
window = Window(spec["start_ms"], spec["end_ms"])
for row in spec["rows"]:
    row["window_start"] = datetime.fromtimestamp(row["window_start"] / 1000, UTC)
    row["window_end"] = datetime.fromtimestamp(row["window_end"] / 1000, UTC)
    row["sum_value"] = Decimal(row["sum_value"])
publish_pane(CommitStore(LocalStore(home + "/commits")), asset="event_counts", window=window, pane=1,
             rows=spec["rows"], schema=[tuple(c) for c in spec["schema"]], sink_root=home + "/published",
             bigquery=BigQueryTarget(*spec["target"][:3], tuple(spec["target"][3])), rows_per_shard=2)
print("not crashed")
"""


def run_child(code: str, *args: str, crash_at: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ONCEFLOW_CRASH_AT": crash_at, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


# --- crashes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", range(1, STEP_COUNT + 1))
def test_a_crash_after_step_k_is_finished_by_the_next_run(
    k: int, home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    sequence = publish(home, target).sequence
    assert [s.kind for s in sequence.steps] == ["file_finalize", "file_finalize", "bigquery_load", "high_watermark"]

    crashed = run_child(
        CHILD, str(home / "commits"), bigquery_emulator.endpoint, sequence.id, "run-1", crash_at=f"commit.after_step#{k}"
    )
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert "crash injected at commit.after_step" in crashed.stderr
    state = commit_store(home).state(sequence.id)
    # Step k executed but the crash came before it was recorded.
    assert state.steps == (DONE,) * (k - 1) + (PENDING,) * (STEP_COUNT - k + 1)
    assert [(a.number, a.outcome) for a in state.attempts] == [(1, None)]

    result = run_sequence(context(home, bigquery_emulator), sequence.id, run_id="run-2")

    assert (result.outcome, result.attempt, result.error) == (DONE, 2, None)
    assert result.verified == (k - 1,)  # found in effect, not executed twice
    assert result.executed == tuple(range(k, STEP_COUNT))
    assert commit_store(home).state(sequence.id).status == DONE
    assert_published_once(home, bigquery_client, target)


def test_a_crash_after_writing_the_sequence_leaves_it_for_the_next_run(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    rows = [
        {**row, "window_start": WINDOW.start_ms, "window_end": WINDOW.end_ms, "sum_value": str(row["sum_value"])}
        for row in pane_rows(WINDOW, 1, PANE_1)
    ]
    spec = {"start_ms": WINDOW.start_ms, "end_ms": WINDOW.end_ms, "rows": rows,
            "target": [target.project, target.dataset, target.table, list(target.key_columns)],
            "schema": WINDOW_SCHEMA}

    crashed = run_child(CHILD_PUBLISH, str(home), json.dumps(spec), crash_at="commit.after_write_sequence")

    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert "not crashed" not in crashed.stdout
    store = commit_store(home)
    seq_id = sequence_id(ASSET, WINDOW.key, 1)
    assert store.unfinished() == [seq_id]
    state = store.state(seq_id)
    assert (state.status, state.steps, state.attempts) == (PENDING, (PENDING,) * STEP_COUNT, ())
    # Nothing executed: only the hidden temp files exist, BigQuery has no table, no watermark.
    files = sink_files(home)
    assert len(files) == 2
    assert all(re.fullmatch(rf"{ASSET}/window={WINDOW.key}/pane=1/\.part-0000[01]\.jsonl\.[0-9a-f]{{12}}\.tmp", f)
               for f in files)
    assert sorted(files.values()) == sorted(expected_files(WINDOW, 1, PANE_1).values())
    assert tables(bigquery_client, target) == []
    assert store.published_through(ASSET) is None

    # Publishing the pane again (the asset's retry) finds the sequence and writes nothing.
    again = publish(home, target)
    assert (again.created, again.sequence.id) == (False, seq_id)
    assert sink_files(home) == files

    result = run_sequence(context(home, bigquery_emulator), seq_id, run_id="run-2")
    assert (result.outcome, result.executed) == (DONE, (0, 1, 2, 3))
    assert_published_once(home, bigquery_client, target)


# --- failures, quarantine, re-arm -----------------------------------------------------------------------------


def test_a_sequence_that_keeps_failing_is_quarantined_and_completes_after_rearm(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client
) -> None:
    missing = BigQueryTarget(bigquery_client.project, f"missing_{uuid.uuid4().hex[:12]}", ASSET)
    sequence = publish(home, missing, max_attempts=3).sequence
    ctx = context(home, bigquery_emulator)

    outcomes = [run_sequence(ctx, sequence.id, run_id=f"run-{n}") for n in (1, 2, 3)]

    assert [(r.outcome, r.attempt) for r in outcomes] == [(FAILED, 1), (FAILED, 2), (QUARANTINED, 3)]
    for result in outcomes:
        assert result.error is not None
        assert result.error.startswith(f"step 2 (bigquery_load {missing.project}.{missing.dataset}.{ASSET} ")
        assert f"Not found: Dataset {missing.project}:{missing.dataset}" in result.error
    with pytest.raises(RuntimeError, match="attempt 3: step 2"):
        outcomes[2].raise_on_failure()
    store = ctx.store
    state = store.state(sequence.id)
    assert (state.status, state.steps) == (QUARANTINED, (DONE, DONE, PENDING, PENDING))
    assert state.last_error == outcomes[2].error
    assert store.quarantined() == [sequence.id]
    assert store.unfinished() == []
    refused = run_sequence(ctx, sequence.id, run_id="run-4")
    assert (refused.outcome, refused.attempt, refused.error) == (QUARANTINED, None, None)
    assert len(store.state(sequence.id).attempts) == 3

    bigquery_client.create_dataset(missing.dataset)  # the operator fixes the cause
    store.rearm(sequence.id)
    result = run_sequence(ctx, sequence.id, run_id="run-5")

    assert (result.outcome, result.attempt, result.executed) == (DONE, 4, (2, 3))
    assert sink_files(home) == expected_files(WINDOW, 1, PANE_1)
    assert table_rows(bigquery_client, missing) == expected_rows(WINDOW, 1, PANE_1)
    assert [e.event for e in store.state(sequence.id).history] == [QUARANTINED, "rearmed"]


def test_retries_of_one_dagster_run_are_one_attempt(home: Path) -> None:
    """A FileFinalize whose temp file is missing (and final absent) fails until the file is back."""
    sequence = publish(home, None, max_attempts=2).sequence
    first = sequence.steps[0]
    assert isinstance(first, FileFinalize)
    temp = home / "published" / first.temp_key
    kept = temp.read_bytes()
    temp.unlink()
    ctx = context(home)

    # Dagster retries the run twice: three runs, one lineage, one attempt of the budget of two.
    results = [run_sequence(ctx, sequence.id, run_id=f"run-{n}", root_run_id="root-A") for n in (1, 2, 3)]
    assert [(r.outcome, r.attempt) for r in results] == [(FAILED, 1)] * 3
    assert results[0].error == (
        f"step 0 (file_finalize {home}/published/{first.final_key}): FileNotFoundError: neither the temp file "
        f"{temp} nor a final file {home}/published/{first.final_key} with the expected bytes exists"
    )
    state = ctx.store.state(sequence.id)
    assert (state.status, state.attempts_used, [a.root_run_id for a in state.attempts]) == (
        PENDING, 1, ["root-A"] * 3,
    )

    assert run_sequence(ctx, sequence.id, run_id="run-4", root_run_id="root-B").outcome == QUARANTINED
    temp.write_bytes(kept)  # the cause is fixed
    ctx.store.rearm(sequence.id)
    result = run_sequence(ctx, sequence.id, run_id="run-5", root_run_id="root-C")
    assert (result.outcome, result.attempt) == (DONE, 3)
    assert sink_files(home) == expected_files(WINDOW, 1, PANE_1)


def test_a_failed_bigquery_job_id_is_never_reused_for_a_new_job(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    # A table with the right name and a REQUIRED column the output does not give makes the MERGE job fail.
    wrong = [*(bigquery.SchemaField(name, kind) for name, kind in WINDOW_SCHEMA),
             bigquery.SchemaField("owner", "STRING", mode="REQUIRED")]
    bigquery_client.create_table(bigquery.Table(f"{target.project}.{target.dataset}.{ASSET}", schema=wrong))
    sequence = publish(home, target).sequence
    load = sequence.steps[2]
    assert isinstance(load, BigQueryLoad)
    ctx = context(home, bigquery_emulator)

    failed = run_sequence(ctx, sequence.id, run_id="run-1")
    assert failed.outcome == FAILED
    assert f"BigQuery merge job {load.job_id('merge', 0)} failed" in (failed.error or "")

    bigquery_client.delete_table(f"{target.project}.{target.dataset}.{ASSET}")  # the operator fixes the table
    result = run_sequence(ctx, sequence.id, run_id="run-2")

    assert result.outcome == DONE
    assert bigquery_client.get_job(load.job_id("load", 0)).error_result is None  # the first load's result was used
    with pytest.raises(NotFound):
        bigquery_client.get_job(load.job_id("load", 1))
    assert bigquery_client.get_job(load.job_id("merge", 0)).error_result is not None
    assert bigquery_client.get_job(load.job_id("merge", 1)).error_result is None  # the next generation ran
    assert_published_once(home, bigquery_client, target)


def test_a_bigquery_job_still_running_when_submitted_and_failing_later_is_a_failed_job(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    # The emulator answers a submission after 1 s, as BigQuery may: this job is still RUNNING then. Waiting for
    # it, the results call fails (400) before the job's status says DONE with its error: that is a failed job,
    # never a done one.
    load = publish(home, target).sequence.steps[2]
    assert isinstance(load, BigQueryLoad)
    slow = "SELECT IF(SUM(x) > 0, ERROR('boom'), 0) AS y FROM UNNEST(GENERATE_ARRAY(1, 8000000)) AS x"
    submitted: list[bigquery.QueryJob] = []

    def submit(job_id: str) -> bigquery.QueryJob:
        submitted.append(bigquery_client.query(slow, job_id=job_id, job_retry=None))
        return submitted[0]

    with pytest.raises(RuntimeError, match=rf"BigQuery merge job {load.job_id('merge', 0)} failed: .*boom"):
        run_job(bigquery_client, target.project, "merge", lambda g: load.job_id("merge", g), submit, 600.0)
    assert submitted[0].state == "DONE"


# --- concurrency ----------------------------------------------------------------------------------------------


def all_at_once(count: int, work: Callable[[int], T]) -> list[T]:
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def test_two_runners_at_once_publish_exactly_once(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    sequence = publish(home, target).sequence

    # Two runs (separate contexts, clients and lineages) drive the same sequence at the same time.
    results = all_at_once(2, lambda i: run_sequence(context(home, bigquery_emulator), sequence.id, run_id=f"run-{i}"))

    assert all(r.error is None for r in results), [r.error for r in results]
    assert {r.outcome for r in results} <= {DONE, "already_done"}
    assert DONE in {r.outcome for r in results}
    assert commit_store(home).state(sequence.id).status == DONE
    assert_published_once(home, bigquery_client, target)
    load = sequence.steps[2]
    assert isinstance(load, BigQueryLoad)
    for job in ("load", "merge"):  # one job each ran; the other runner found it by its id
        assert bigquery_client.get_job(load.job_id(job, 0)).error_result is None
        with pytest.raises(NotFound):
            bigquery_client.get_job(load.job_id(job, 1))


def test_two_publishers_at_once_write_one_sequence(home: Path) -> None:
    published = all_at_once(2, lambda i: publish(home, None))

    assert sorted(p.created for p in published) == [False, True]
    assert published[0].sequence == published[1].sequence
    winner = next(p.sequence for p in published if p.created)
    temps = sorted(s.temp_key for s in winner.steps if isinstance(s, FileFinalize))
    # The loser removed its own temp files; the winner's are the only ones.
    assert sorted(k for k in sink_files(home)) == temps
    assert run_sequence(context(home), winner.id, run_id="run-1").outcome == DONE
    assert sink_files(home) == expected_files(WINDOW, 1, PANE_1)


# --- panes ----------------------------------------------------------------------------------------------------


def test_a_refired_pane_replaces_the_window_in_bigquery(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    ctx = context(home, bigquery_emulator)
    other = {"a": (9, "9.000000000")}
    for window, pane, values in ((OTHER_WINDOW, 1, other), (WINDOW, 1, PANE_1), (WINDOW, 2, PANE_2)):
        sequence = publish(home, target, window=window, pane=pane, values=values).sequence
        assert run_sequence(ctx, sequence.id, run_id=f"run-{sequence.id}").outcome == DONE

    assert table_rows(bigquery_client, target) == sorted(
        expected_rows(WINDOW, 2, PANE_2) + expected_rows(OTHER_WINDOW, 1, other)
    )
    assert sink_files(home) == {
        **expected_files(WINDOW, 1, PANE_1), **expected_files(WINDOW, 2, PANE_2),
        **expected_files(OTHER_WINDOW, 1, other),
    }
    assert ctx.store.published_through(ASSET) == OTHER_WINDOW.end_ms

    # Pane 1 redone late (a stale retry) changes nothing and counts as published: pane 2 superseded it.
    stale = next(s for s in publish(home, target).sequence.steps if isinstance(s, BigQueryLoad))
    stale.execute(ctx)
    assert stale.verify(ctx)
    assert table_rows(bigquery_client, target) == sorted(
        expected_rows(WINDOW, 2, PANE_2) + expected_rows(OTHER_WINDOW, 1, other)
    )


def test_an_empty_pane_publishes_an_empty_file_and_no_rows(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    sequence = publish(home, target, values={}).sequence
    assert run_sequence(context(home, bigquery_emulator), sequence.id, run_id="run-1").outcome == DONE

    assert sink_files(home) == {f"{ASSET}/window={WINDOW.key}/pane=1/part-00000.jsonl": ""}
    assert table_rows(bigquery_client, target) == []
    assert tables(bigquery_client, target) == [ASSET]
    assert commit_store(home).published_through(ASSET) == WINDOW.end_ms


def test_a_transform_that_gains_a_column_has_it_added_to_the_bigquery_table_and_a_type_change_is_named(
    home: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, target: BigQueryTarget
) -> None:
    ctx = context(home, bigquery_emulator)
    older = tuple(c for c in WINDOW_SCHEMA if c[0] != "timing")  # the output before it gained `timing`
    first = publish_pane(commit_store(home), asset=ASSET, window=OTHER_WINDOW, pane=1,
                         rows=[{k: v for k, v in r.items() if k != "timing"} for r in pane_rows(OTHER_WINDOW, 1, PANE_1)],
                         schema=older, sink_root=str(home / "published"), bigquery=target, rows_per_shard=2).sequence
    assert run_sequence(ctx, first.id, run_id="run-1").outcome == DONE
    second = publish(home, target).sequence
    assert run_sequence(ctx, second.id, run_id="run-2").outcome == DONE  # not quarantined for a new column
    assert table_rows(bigquery_client, target) == sorted(
        expected_rows(WINDOW, 1, PANE_1) + [(*row[:5], None) for row in expected_rows(OTHER_WINDOW, 1, PANE_1)])

    retyped = tuple((name, "STRING" if name == "count" else kind) for name, kind in WINDOW_SCHEMA)
    rows = [{**r, "count": str(r["count"])} for r in pane_rows(WINDOW, 2, PANE_2)]
    third = publish_pane(commit_store(home), asset=ASSET, window=WINDOW, pane=2, rows=rows, schema=retyped,
                         sink_root=str(home / "published"), bigquery=target, rows_per_shard=2).sequence
    assert run_sequence(ctx, third.id, run_id="run-3").outcome != DONE
    assert "column 'count' is INT64, the output now gives STRING" in (commit_store(home).state(third.id).last_error
                                                                         or "")


# --- steps in isolation ---------------------------------------------------------------------------------------


class ObjectStorage:
    """Local disk seen only through the `ObjectStore` interface, as FileFinalize sees object storage (no rename)."""

    def __init__(self, root: str) -> None:
        self.local = LocalStore(root)
        self.uri = self.local.uri
        self.changes: list[tuple[str, str]] = []

    def write(self, key: str, data: bytes) -> None:
        self.changes.append(("write", key))
        self.local.write(key, data)

    def delete(self, key: str) -> None:
        self.changes.append(("delete", key))
        self.local.delete(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)


def test_file_finalize_on_object_storage_copies_then_deletes(home: Path) -> None:
    root = str(home / "published")
    sink = ObjectStorage(root)
    ctx = CommitContext(commit_store(home), sinks={root: sink})  # type: ignore[dict-item]
    step = FileFinalize(root, "d/.part-00000.jsonl.t.tmp", "d/part-00000.jsonl", sha256_hex(b"x\n"))
    sink.write(step.temp_key, b"x\n")
    assert not step.verify(ctx)

    sink.changes.clear()
    step.execute(ctx)
    assert step.verify(ctx)
    assert sink_files(home) == {"d/part-00000.jsonl": "x\n"}
    assert sink.changes == [("write", step.final_key), ("delete", step.temp_key)]

    # A crash between the copy and the delete: executing again only deletes the temp file.
    sink.write(step.temp_key, b"x\n")
    assert not step.verify(ctx)
    sink.changes.clear()
    step.execute(ctx)
    assert step.verify(ctx)
    assert sink_files(home) == {"d/part-00000.jsonl": "x\n"}
    assert sink.changes == [("delete", step.temp_key)]


def test_file_finalize_repairs_a_wrong_final_and_refuses_a_corrupt_temp(home: Path) -> None:
    root = str(home / "published")
    sink = LocalStore(root)
    ctx = CommitContext(commit_store(home))
    step = FileFinalize(root, "d/.part-00000.jsonl.t.tmp", "d/part-00000.jsonl", sha256_hex(b"right\n"))

    sink.write(step.final_key, b"wrong\n")
    sink.write(step.temp_key, b"right\n")
    assert not step.verify(ctx)
    step.execute(ctx)
    assert step.verify(ctx)
    assert sink_files(home) == {"d/part-00000.jsonl": "right\n"}

    step.execute(ctx)  # idempotent
    assert sink_files(home) == {"d/part-00000.jsonl": "right\n"}

    sink.write(step.final_key, b"wrong\n")
    sink.write(step.temp_key, b"corrupt\n")
    with pytest.raises(ValueError, match="does not hold the bytes"):
        step.execute(ctx)
    assert sink_files(home) == {"d/part-00000.jsonl": "wrong\n", "d/.part-00000.jsonl.t.tmp": "corrupt\n"}


def test_high_watermark_step(home: Path) -> None:
    ctx = CommitContext(commit_store(home))
    later, earlier = HighWatermark(ASSET, 2_000), HighWatermark(ASSET, 1_000)
    assert not later.verify(ctx)
    later.execute(ctx)
    assert later.verify(ctx) and earlier.verify(ctx)
    earlier.execute(ctx)
    assert ctx.store.published_through(ASSET) == 2_000


def test_steps_round_trip_through_their_stored_form(home: Path) -> None:
    sequence = publish(home, BigQueryTarget("onceflow-local", "ds", ASSET)).sequence
    stored = commit_store(home).get(sequence.id)
    assert stored is not None
    assert CommitSequence.from_record(stored) == sequence
    assert [s["kind"] for s in stored.steps] == ["file_finalize", "file_finalize", "bigquery_load", "high_watermark"]
    assert stored.steps[3] == {"kind": "high_watermark", "asset": ASSET, "published_through_ms": WINDOW.end_ms}
    first_part = f"{ASSET}/window=2026-11-21-10:05/pane=1/part-00000.jsonl"
    assert stored.steps[0] == {
        "kind": "file_finalize", "root": str(home / "published"),
        "temp_key": sequence.steps[0].temp_key,  # type: ignore[attr-defined]
        "final_key": first_part,
        "sha256": sha256_hex(expected_files(WINDOW, 1, PANE_1)[first_part].encode()),
    }
    load = stored.steps[2]
    assert (load["expected_rows"], load["expected_sums"]) == (3, [
        ["count", "11"], ["sum_value", "12345678901234567889.373456789"], ["raw_version", "33"], ["pane", "3"],
    ])
    with pytest.raises(ValueError, match="unknown commit step kind 'nope'"):
        step_from_dict({"kind": "nope"})


def test_ids_are_deterministic_and_valid() -> None:
    assert sequence_id(ASSET, "2026-11-21-10:05", 1) == "event_counts:2026-11-21-10:05:pane-1"
    assert sequence_id("team/event_counts", "2026-11-21-10:05", 2) == "team.event_counts:2026-11-21-10:05:pane-2"

    def load(**change: Any) -> BigQueryLoad:
        params: dict[str, Any] = {
            "project": "p-1", "dataset": "d", "table": "t", "asset": ASSET, "window_key": "2026-11-21-10:05",
            "window_start_ms": WINDOW.start_ms, "pane": 1, "files_root": "/x", "files": (),
            "schema": (("window_start", "TIMESTAMP"), ("key", "STRING"), ("pane", "INT64")), "expected_rows": 0,
        }
        return BigQueryLoad(**(params | change))

    ids = {load().job_id("load", 0), load().job_id("merge", 0), load().job_id("load", 1),
           load(pane=2).job_id("load", 0), load(window_key="2026-11-21-10:06").job_id("load", 0),
           load(table="u").job_id("load", 0)}
    assert len(ids) == 6
    assert load().job_id("load", 0) == load(files=(("k", "s"),), expected_rows=5).job_id("load", 0)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,1024}", i) for i in ids)
    assert load().job_id("load", 0).startswith("onceflow_event_counts_2026-11-21-10-05_pane1_load_")
    with pytest.raises(ValueError, match="invalid BigQuery column"):
        load(schema=(("window_start", "TIMESTAMP"), ("key; DROP", "STRING"), ("pane", "INT64")))
    with pytest.raises(ValueError, match="lacks the column 'key'"):
        load(schema=(("window_start", "TIMESTAMP"), ("pane", "INT64")))


def test_publish_refuses_rows_that_do_not_belong(home: Path) -> None:
    rows = pane_rows(WINDOW, 1, PANE_1)
    with pytest.raises(ValueError, match="not in window"):
        publish_pane(commit_store(home), asset=ASSET, window=OTHER_WINDOW, pane=1, rows=rows,
                     schema=WINDOW_SCHEMA, sink_root=str(home / "published"))
    with pytest.raises(ValueError, match="not in pane 2"):
        publish_pane(commit_store(home), asset=ASSET, window=WINDOW, pane=2, rows=rows,
                     schema=WINDOW_SCHEMA, sink_root=str(home / "published"))
    with pytest.raises(ValueError, match="only final panes"):
        publish_pane(commit_store(home), asset=ASSET, window=WINDOW, pane=0, rows=rows,
                     schema=WINDOW_SCHEMA, sink_root=str(home / "published"))
    naive = [{**rows[0], "window_end": rows[0]["window_end"].replace(tzinfo=None)}]
    with pytest.raises(ValueError, match="timezone-aware"):
        publish_pane(commit_store(home), asset=ASSET, window=WINDOW, pane=1, rows=naive,
                     schema=WINDOW_SCHEMA, sink_root=str(home / "published"))
    too_fine = [{**rows[0], "sum_value": Decimal("0.0000000001")}]
    with pytest.raises(ValueError, match="more than 9 decimal places"):
        publish_pane(commit_store(home), asset=ASSET, window=WINDOW, pane=1, rows=too_fine,
                     schema=WINDOW_SCHEMA, sink_root=str(home / "published"))
    with pytest.raises(ValueError, match="differ from the schema"):
        publish_pane(commit_store(home), asset=ASSET, window=WINDOW, pane=1, rows=[{"key": "a"}],
                     schema=WINDOW_SCHEMA, sink_root=str(home / "published"))
    assert commit_store(home).sequences() == []


def test_publish_accepts_a_pyarrow_table(home: Path) -> None:
    import pyarrow as pa

    rows = pane_rows(WINDOW, 1, PANE_1)
    table = pa.Table.from_pylist(list(reversed(rows)), schema=pa.schema([
        ("window_start", pa.timestamp("us", tz="UTC")), ("window_end", pa.timestamp("us", tz="UTC")),
        ("key", pa.string()), ("count", pa.int64()), ("sum_value", pa.decimal128(38, 9)),
        ("raw_version", pa.int64()), ("pane", pa.int32()), ("timing", pa.string()),
    ]))
    sequence = publish_pane(commit_store(home), asset=ASSET, window=WINDOW, pane=1, rows=table,
                            schema=WINDOW_SCHEMA, sink_root=str(home / "published"), rows_per_shard=2).sequence
    assert run_sequence(context(home), sequence.id, run_id="run-1").outcome == DONE
    assert sink_files(home) == expected_files(WINDOW, 1, PANE_1)
