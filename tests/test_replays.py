"""Replays of one batch across what operators do between its attempts, staged from outside with crash and pause
points: a deploy that changes the declaration (a run killed between a batch's two commits, the next attempt under
the new release), and a checkpoint restored from an older copy while an attempt is still running. Every record
ends in exactly one table, once; rows read back with delta-rs."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.declare.record_contract import ContractChanged, RecordContract
from onceflow.orchestration.workload import make_events
from onceflow.resources.faults import CRASH_EXIT_CODE
from tests.delta_reader import read_rows
from tests.pauses import release, wait_paused
from tests.pipelines import builtin, dagster_micro_batch, drain, events_from_files, micro_batch_started
from tests.replay_pipelines import V1, V2
from tests.test_windows import write_events

pytestmark = pytest.mark.engine_paths


def orders(directory: Path, name: str, count: int, malformed: int = 0) -> None:
    """A file of `count` orders, every fourth with a text `note` (valid under V1, a `wrong_type` under V2), and
    `malformed` lines that are not JSON."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
    lines = []
    for i in range(count):
        order = {"order_id": f"{name}{i}", "ts": stamp, "customer": f"c{i % 3}", "amount": f"{i}.50"}
        if i % 4 == 0:
            order["note"] = "call first"
        lines.append(json.dumps(order))
    lines += [f"{{broken {i}" for i in range(malformed)]
    (directory / f"{name}.jsonl").write_text("".join(f"{line}\n" for line in lines))


def tables(home: Path) -> tuple[list[str], list[str]]:
    raw, dead = (home / "lake" / "raw" / "orders"), (home / "lake" / "dead_letter" / "orders")
    held = [sorted(r[0] for r in read_rows(str(path), ["record_id"])) if path.exists() else [] for path in (raw, dead)]
    return held[0], held[1]


@pytest.fixture
def replay(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "orders"
    directory.mkdir()
    monkeypatch.setenv("ONCEFLOW_PIPELINES", "tests.replay_pipelines")
    monkeypatch.setenv("REPLAY_DIR", str(directory))
    return directory


def test_a_batch_killed_between_its_commits_is_replayed_under_the_contract_it_was_planned_under(
    replay: Path, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders(replay, "a", 40, malformed=5)
    monkeypatch.setenv("REPLAY_SCHEMA", V1)
    killed = dagster_micro_batch(str(home), "ingest.after_dead_letters", pipeline="orders")
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr[-3000:]
    assert len(tables(home)[1]) == 5  # its dead letters committed, its valid records not yet
    monkeypatch.setenv("REPLAY_SCHEMA", V2)  # the deploy: a nullable field added
    done = dagster_micro_batch(str(home), None, pipeline="orders")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    raw, dead = tables(home)
    assert raw == sorted(f"a{i}" for i in range(40))  # the noted ones too: valid under the plan's contract
    assert len(dead) == 5 and not set(raw) & set(dead)
    # Batches planned after the deploy are classified under it: a noted order is now a dead letter.
    orders(replay, "b", 8)
    done = dagster_micro_batch(str(home), None, pipeline="orders")
    raw_after, dead_after = tables(home)
    assert sorted(set(dead_after) - set(dead)) == ["b0", "b4"] and len(raw_after) == 46


def test_a_committed_batch_replayed_after_a_deploy_writes_nothing_more(
    replay: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders(replay, "a", 40)
    monkeypatch.setenv("REPLAY_SCHEMA", V1)
    killed = dagster_micro_batch(str(home), "ingest.after_merge", pipeline="orders")
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr[-3000:]
    monkeypatch.setenv("REPLAY_SCHEMA", V2)
    done = dagster_micro_batch(str(home), None, pipeline="orders")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert tables(home) == (sorted(f"a{i}" for i in range(40)), [])  # never in both tables


def test_a_batch_planned_under_one_delivery_mode_is_refused_under_another() -> None:
    pipeline = builtin("events")
    planned = RecordContract.of(pipeline).to_dict("at_least_once")
    with pytest.raises(ContractChanged, match=r"planned under delivery='at_least_once'.*--drop-uncommitted"):
        RecordContract.planned(pipeline, planned, "events/pubsub batch 3")
    assert RecordContract.planned(pipeline, RecordContract.of(pipeline).to_dict(pipeline.delivery), "b") == \
        RecordContract.of(pipeline)


def test_a_checkpoint_restored_under_a_running_batch_advances_with_the_plan_the_lake_committed(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = events_from_files(tmp_path, monkeypatch, max_files=10)
    start_ms = int(time.time() * 1000) - 600_000
    files = {name: make_events(10, start_ms, 60_000, seed=n, prefix=name) for n, name in enumerate("abc")}
    for name in "ab":
        write_events(directory / f"{name}.jsonl", files[name])
    # Two instances: in one, B would wait for A's turn (turns keep one batch in flight; exactly-once does not
    # depend on them).
    for name in ("dagster-a", "dagster-b"):
        (tmp_path / name).mkdir()
    # A plans batch 1 (a, b) and is held; it will commit it and die before its checkpoint moves.
    first = micro_batch_started(str(home), str(tmp_path / "dagster-a"), "ingest.after_merge",
                                pause_at="ingest.after_plan")
    wait_paused(home, "ingest.after_plan", first)
    shutil.rmtree(home / "checkpoints")  # restored from a copy taken before batch 1
    write_events(directory / "c.jsonl", files["c"])
    # B plans batch 1 again, now a, b and c, and is held before its raw commit.
    second = micro_batch_started(str(home), str(tmp_path / "dagster-b"), pause_at="ingest.before_raw_commit")
    wait_paused(home, "ingest.before_raw_commit", second)
    release(home, "ingest.after_plan")
    assert first.wait(180) == CRASH_EXIT_CODE
    release(home, "ingest.before_raw_commit")
    second_out = second.communicate(timeout=180)[0]
    assert second.returncode == 0, second_out[-3000:]

    drain(lambda: spark, _events_source(home))
    raw = sorted(r[0] for r in read_rows(str(home / "lake" / "raw" / "events"), ["record_id"]))
    assert raw == sorted(e.event_id for events in files.values() for e in events)  # c's too, once


def _events_source(home: Path):
    from onceflow.jobs.sources.reader import open_source
    from onceflow.resources.lake import LakeResource

    return open_source(builtin("events"), LakeResource(home=str(home)))


def test_checkpoint_totals_count_the_batches_a_restore_skipped(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = events_from_files(tmp_path, monkeypatch, max_files=1)
    start_ms = int(time.time() * 1000) - 600_000
    source = _events_source(home)

    def batch(name: str, seed: int) -> None:
        events = make_events(10, start_ms, 60_000, seed=seed, prefix=name)
        lines = [e.json_line() for e in [*events, events[0]]] + ["not json"]  # a producer's retry, a bad line
        (directory / f"{name}.jsonl").write_text("".join(f"{line}\n" for line in lines))
        drain(lambda: spark, source)

    batch("a", 1)
    copy = tmp_path / "copy"
    shutil.copytree(home / "checkpoints", copy)
    batch("b", 2)
    batch("c", 3)
    shutil.rmtree(home / "checkpoints")
    shutil.copytree(copy, home / "checkpoints")  # the older copy restored
    batch("d", 4)
    totals = source.checkpoints.load().totals
    assert totals == {"received": 48, "inserted": 40, "duplicates": 4, "dead_lettered": 4}


def test_an_attempt_whose_batch_another_attempt_committed_reports_none_of_it(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from onceflow.jobs.ingest_job import raw_asset_key

    directory = events_from_files(tmp_path, monkeypatch, max_files=10)
    write_events(directory / "a.jsonl", make_events(20, int(time.time() * 1000) - 600_000, 60_000))
    instances = [tmp_path / "dagster-a", tmp_path / "dagster-b"]  # two, so that neither waits for the other's turn
    for path in instances:
        path.mkdir()
    winner = micro_batch_started(str(home), str(instances[0]), pause_at="ingest.before_raw_commit")
    wait_paused(home, "ingest.before_raw_commit", winner)
    other = micro_batch_started(str(home), str(instances[1]), pause_at="ingest.after_plan")  # the same batch
    wait_paused(home, "ingest.after_plan", other)
    release(home, "ingest.before_raw_commit")
    assert winner.wait(180) == 0, winner.stdout.read()[-3000:] if winner.stdout else ""
    release(home, "ingest.after_plan")
    assert other.wait(180) == 0, other.stdout.read()[-3000:] if other.stdout else ""
    inserted = []
    for path in instances:
        with dg.DagsterInstance.from_config(str(path)) as instance:
            event = instance.get_latest_materialization_event(raw_asset_key(builtin("events")))
            metadata = event.asset_materialization.metadata
            inserted.append((metadata["batch_id"].value, metadata["inserted"].value, metadata["replayed_batch_noop"].value))
    assert inserted == [(1, 20, False), (1, 0, True)]  # Dagster's sums count the batch once


def test_a_merge_without_the_fast_path_and_a_blind_append_racing_for_one_batch_commit_it_once(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from onceflow.jobs.ingest_job import raw_asset_key

    directory = events_from_files(tmp_path, monkeypatch, max_files=10)
    events = make_events(30, int(time.time() * 1000) - 600_000, 60_000)
    write_events(directory / "a.jsonl", events)
    instances = [tmp_path / "dagster-append", tmp_path / "dagster-merge"]
    for path in instances:
        path.mkdir()
    # The append decided its rows against the ID filters and is held just before its commit...
    append = micro_batch_started(str(home), str(instances[0]), pause_at="ingest.before_raw_commit")
    wait_paused(home, "ingest.before_raw_commit", append)
    # ...while a process with the fast path off MERGEs the same batch and commits it.
    merge = dagster_micro_batch(str(home), None, dagster_home=str(instances[1]), dedup_fast_path="false")
    assert merge.returncode == 0, merge.stdout[-3000:] + merge.stderr[-3000:]
    release(home, "ingest.before_raw_commit")
    out = append.communicate(timeout=180)[0]
    assert append.returncode == 0, out[-3000:]
    raw = [r[0] for r in read_rows(str(home / "lake" / "raw" / "events"), ["record_id"])]
    assert sorted(raw) == sorted(e.event_id for e in events)  # once: Delta's conflict check stopped the append
    seen = []
    for path in instances:
        with dg.DagsterInstance.from_config(str(path)) as instance:
            metadata = instance.get_latest_materialization_event(raw_asset_key(builtin("events"))) \
                .asset_materialization.metadata
            seen.append((metadata["inserted"].value, metadata["lost_commit_race"].value))
    assert seen == [(0, True), (30, False)]
