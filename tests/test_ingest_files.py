"""Exactly-once ingest from a directory of JSON-lines files, checked with delta-rs."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import DeclarationError, Pipeline
from onceflow.jobs.delta.commit_log import committed_batch
from onceflow.jobs.ingest.micro_batch import WIDE_BATCH_BUCKETS, run_micro_batch
from onceflow.jobs.run_relay import READY_TAG, RELEASED_TAG, stamped
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.workload import Event, expected_raw, make_events
from onceflow.resources.files import FileChangedError
from onceflow.resources.lake import LakeResource
from onceflow.resources.spark_functions import register_spark_functions
from tests.delta_reader import read_rows
from tests.pipelines import builtin, dagster_micro_batch, drain, events_from_files

RAW = ["record_id", "event_time", "key", "value"]
START_MS = 1_763_720_000_000
MICROS_TIME = datetime.fromtimestamp(START_MS / 1000, UTC) + timedelta(microseconds=123_456)
BAD_LINES = [
    ("not_json", "{not json"),
    ("not_json", ' \t[{"event_id": "f-bad-0"}]'),
    ("missing_field", json.dumps({"event_id": "f-bad-1", "event_time": MICROS_TIME.isoformat(), "value": 1})),
    ("wrong_type", json.dumps({"event_id": "f-bad-2", "event_time": START_MS, "key": "k", "value": [1]})),
    ("bad_event_time", json.dumps({"event_id": "f-bad-3", "event_time": "soon", "key": "k", "value": 1})),
    ("missing_event_time", json.dumps({"event_id": "f-bad-4", "key": "k", "value": 1})),
]


def write_jsonl(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


@pytest.fixture
def incoming(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return events_from_files(tmp_path, monkeypatch, max_files=2)


def seed_files(directory: Path) -> list[Event]:
    events = make_events(300, START_MS, 300_000, seed=21, prefix="f")
    write_jsonl(directory / "a.jsonl", [e.json_line() for e in events[:100]])
    # b repeats ten of a's records (a producer retry across files) and carries the bad lines.
    write_jsonl(directory / "b.jsonl", [e.json_line() for e in events[100:200] + events[:10]] + [b for _, b in BAD_LINES])
    write_jsonl(directory / "sub" / "c.jsonl", [e.json_line() for e in events[200:]])
    return events


def source_for(pipeline: Pipeline, home: Path) -> SourceRuntime:
    return open_source(pipeline, LakeResource(home=str(home)))


def plan_next(source: SourceRuntime):
    """Plan the next batch without reading it, as a run that died right after planning would have."""
    return source.reader.next_plan(source.checkpoints.load(), None)


@pytest.mark.engine_paths
def test_files_land_exactly_once_with_dead_letters(spark: SparkSession, incoming: Path, home: Path) -> None:
    events = seed_files(incoming)
    pipeline = builtin("events")
    source = source_for(pipeline, home)

    results = drain(lambda: spark, source)

    assert [sorted(f.path for f in source.checkpoints.get_plan(r.batch_id).files) for r in results] == [
        ["a.jsonl", "b.jsonl"],
        ["sub/c.jsonl"],
    ]
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    dead = read_rows(source.dead_letter_path, ["reason", "detail"])
    assert sorted(r[0] for r in dead) == sorted(r for r, _ in BAD_LINES)
    assert ("not_json", "payload is JSON ARRAY<OBJECT<event_id: STRING>>, not an object") in dead
    # A dead letter is kept whole: its line, where it was, its event time to the microsecond, its batch.
    line = BAD_LINES[2][1]
    whole = read_rows(source.dead_letter_path, ["record_id", "raw", "source_position", "event_time", "batch_id"])
    offset = (incoming / "b.jsonl").read_bytes().index(line.encode())
    assert [r[1:] for r in whole if r[0] == "f-bad-1"] == [(line, f"b.jsonl:{offset}", MICROS_TIME, results[0].batch_id)]
    assert sum(r.received for r in results) == 310 + len(BAD_LINES)
    assert sum(r.duplicates for r in results) == 10 and all(r.balances() for r in results)
    # Values unique to a record are stored plain: a Parquet dictionary of them only costs (onceflow.resources.spark).
    footer = pq.ParquetFile(next(Path(source.raw_path).rglob("*.parquet"))).metadata.row_group(0)
    # (Spark's writer names a dictionary's encoding PLAIN_DICTIONARY, delta-rs's RLE_DICTIONARY.)
    dictionary = {footer.column(i).path_in_schema: bool({"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(
        footer.column(i).encodings)) for i in range(footer.num_columns)}
    assert [dictionary[c] for c in ("record_id", "payload", "source_position", "key")] == [False, False, False, True]
    # Nothing new: no batch, and the files are not read twice.
    assert run_micro_batch(lambda: spark, source) is None


@pytest.mark.engine_paths
def test_a_pipeline_bucketed_by_day_finds_repeats_across_buckets_and_keeps_its_width(
    spark: SparkSession, incoming: Path, home: Path
) -> None:
    """`time_bucket="1d"` (a backfill's batches span days): the raw table's partitions are days, a repeat is found
    whichever day its first copy went to, and a declaration of another width is refused before anything commits."""
    day = 86_400_000
    events = make_events(300, START_MS, 3 * day, seed=22, prefix="d")
    write_jsonl(incoming / "a.jsonl", [e.json_line() for e in events[:150]])
    write_jsonl(incoming / "b.jsonl", [e.json_line() for e in events[150:]])
    write_jsonl(incoming / "c.jsonl", [e.json_line() for e in events[::30]])  # repeats from every day
    pipeline = dataclasses.replace(builtin("events"), time_bucket="1d", dedup_horizon="7d")
    source = source_for(pipeline, home)

    results = drain(lambda: spark, source)

    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert [r.duplicates for r in results] == [0, 10] and all(r.balances() for r in results)
    buckets = read_rows(source.raw_path, ["time_bucket"])
    assert sorted({b for (b,) in buckets}) == sorted({e.event_time_ms // day for e in events})
    column = next(f for f in DeltaTable(source.raw_path).schema().fields if f.name == "time_bucket")
    assert column.metadata == {"onceflow.bucketMs": day}

    write_jsonl(incoming / "d.jsonl", [e.json_line() for e in make_events(5, START_MS, 1000, seed=23, prefix="h")])
    version = DeltaTable(source.raw_path).version()
    hourly = source_for(dataclasses.replace(pipeline, time_bucket="1h"), home)
    with pytest.raises(DeclarationError, match=r"pipeline 'events': time_bucket: '1h', but its table raw/events "
                                               r"is bucketed by 86400s"):
        run_micro_batch(lambda: spark, hourly)
    assert DeltaTable(source.raw_path).version() == version


def test_a_batch_spanning_too_many_time_buckets_says_what_to_declare(
    spark: SparkSession, incoming: Path, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hour = 3_600_000
    events = make_events(300, START_MS, 60 * 24 * hour, seed=24, prefix="w")
    write_jsonl(incoming / "a.jsonl", [e.json_line() for e in events])
    source = source_for(builtin("events"), home)

    with caplog.at_level(logging.WARNING, logger="onceflow"):
        (result,) = drain(lambda: spark, source)

    times = [e.event_time_ms for e in events]
    spanned = max(times) // hour - min(times) // hour + 1
    assert spanned > WIDE_BATCH_BUCKETS and result.inserted == 300
    assert [r.getMessage() for r in caplog.records if "time buckets" in r.getMessage()] == [
        f"events/files batch {result.batch_id}: its records span {spanned} time buckets of 1h, a file written for "
        "each; a pipeline whose batches span this much event time is faster with a wider `time_bucket` (a table "
        "keeps its own: declare it for a new one)"
    ]


def test_positional_record_ids_without_an_id_field(spark: SparkSession, incoming: Path, home: Path) -> None:
    lines = [json.dumps({"event_time": START_MS, "key": "k", "value": v}) for v in (1, 22, 333)]
    # One batch of two files, one named with characters Spark escapes in the file URIs it reports, its lines ended
    # by CRLF: positions count the CRs, payloads hold none.
    odd = "odd dir %é/x y+z%.jsonl"
    write_jsonl(incoming / "p.jsonl", lines)
    (incoming / odd).parent.mkdir(parents=True, exist_ok=True)
    (incoming / odd).write_bytes("".join(f"{line}\r\n" for line in lines).encode())
    base = builtin("events")
    pipeline = dataclasses.replace(base, source=dataclasses.replace(base.source, id_field=None))
    source = source_for(pipeline, home)

    drain(lambda: spark, source)

    def at(name: str, ending: int) -> list[str]:
        return [f"{name}:{sum(len(line) + ending for line in lines[:i])}" for i in range(len(lines))]

    expected = sorted([*at("p.jsonl", 1), *at(odd, 2)])
    rows = read_rows(source.raw_path, ["record_id", "payload"])
    assert [r[0] for r in rows] == expected
    assert sorted(r[1] for r in rows) == sorted(lines * 2)


def test_a_batch_is_exactly_what_was_planned_before_a_crash(spark: SparkSession, incoming: Path, home: Path) -> None:
    events = seed_files(incoming)
    pipeline = builtin("events")
    source = source_for(pipeline, home)
    plan = plan_next(source)  # planned, then the process died
    assert plan is not None
    late = make_events(5, START_MS, 1000, seed=22, prefix="late")
    write_jsonl(incoming / "0-early-name.jsonl", [e.json_line() for e in late])  # sorts first, arrived later

    results = drain(lambda: spark, source)

    assert sorted(f.path for f in source.checkpoints.get_plan(1).files) == ["a.jsonl", "b.jsonl"]
    assert results[0].batch_id == 1 and results[0].received == 210 + len(BAD_LINES)
    assert read_rows(source.raw_path, RAW) == expected_raw(events + late)


@pytest.mark.engine_paths
def test_crash_after_merge_then_rerun_gives_the_same_table(
    spark: SparkSession, incoming: Path, home: Path
) -> None:
    events = seed_files(incoming)
    # This run builds a classic local Spark session (no Connect server), so that path is exercised too.
    crashed = dagster_micro_batch(str(home), "ingest.after_merge", spark_remote="")
    assert "crash injected at ingest.after_merge" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    pipeline = builtin("events")
    source = source_for(pipeline, home)
    assert source.checkpoints.load().committed_batch == 0  # committed to Delta, checkpoint not advanced

    results = drain(lambda: spark, source)

    assert results[0].batch_id == 1 and results[0].replayed
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert source.checkpoints.load().totals == {
        "received": 310 + len(BAD_LINES),
        "inserted": 300,
        "duplicates": 10,
        "dead_lettered": len(BAD_LINES),
    }


def test_a_file_changed_after_planning_is_an_error_naming_it(
    spark: SparkSession, incoming: Path, home: Path
) -> None:
    seed_files(incoming)
    pipeline = builtin("events")
    source = source_for(pipeline, home)
    plan_next(source)
    with (incoming / "b.jsonl").open("a") as handle:
        handle.write(make_events(1, START_MS, 1, prefix="x")[0].json_line() + "\n")

    with pytest.raises(FileChangedError, match=r"b\.jsonl changed after batch planning"):
        run_micro_batch(lambda: spark, source)
    assert not Path(source.raw_path).exists() or read_rows(source.raw_path, ["record_id"]) == []


def test_an_empty_file_is_taken_once_it_has_bytes(incoming: Path, home: Path) -> None:
    """A producer that creates a file and then writes it is seen between the two: the empty file is not taken
    (a batch taking it would find other bytes when it reads it), and the file is taken whole once written."""
    source = source_for(builtin("events"), home)
    (incoming / "a.jsonl").touch()
    assert not source.reader.has_data(source.checkpoints.load()) and plan_next(source) is None
    sent = make_events(3, START_MS, 1_000, prefix="e")
    write_jsonl(incoming / "a.jsonl", [e.json_line() for e in sent])
    plan = plan_next(source)
    assert plan is not None and [(f.path, f.size) for f in plan.files] == [("a.jsonl", (incoming / "a.jsonl").stat().st_size)]
    assert [line for _, line in source.reader.directory.lines(plan.files[0])] == [e.json_line().encode() for e in sent]


def test_a_warm_run_takes_each_new_batch_as_its_own_materialization(incoming: Path, home: Path, tmp_path: Path) -> None:
    """`ONCEFLOW_MICRO_BATCH_RUN_S`: one run commits a batch, polls, and commits the next file as batch 2, each
    recorded as a materialization of `raw_events` with when it was requested and committed."""
    first = make_events(50, START_MS, 60_000, seed=31, prefix="w1")
    second = make_events(50, START_MS + 60_000, 60_000, seed=32, prefix="w2")
    write_jsonl(incoming / "1.jsonl", [e.json_line() for e in first])
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    outcome: list[subprocess.CompletedProcess[str]] = []
    run = threading.Thread(target=lambda: outcome.append(
        dagster_micro_batch(str(home), None, dagster_home=str(dagster_home), micro_batch_run_s="25")
    ))
    run.start()
    raw = LakeResource(home=str(home)).table_path("raw/events")
    deadline = time.monotonic() + 120
    while (committed_batch(raw, "events/files") or 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    write_jsonl(incoming / "2.jsonl", [e.json_line() for e in second])  # arrives while the run is warm
    run.join(timeout=200)
    assert outcome and outcome[0].returncode == 0, outcome[0].stdout[-3000:] + outcome[0].stderr[-3000:]

    assert read_rows(raw, RAW) == expected_raw(first + second)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        (record,) = instance.get_run_records()
        events = instance.all_logs(record.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    metadata = [{k: v.value for k, v in e.asset_materialization.metadata.items()} for e in events]
    assert [(m["batch_id"], m["inserted"]) for m in metadata] == [(1, 50), (2, 50)]
    assert metadata[0]["requested_at_ms"] == int(record.create_timestamp.timestamp() * 1000)
    assert metadata[0]["committed_at_ms"] <= metadata[1]["requested_at_ms"] < metadata[1]["committed_at_ms"]


def _stamps(dagster_home: Path, tag: str) -> dict[str, int]:
    """Each run's own stamp on `tag` (onceflow.jobs.run_relay), by run id."""
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = instance.get_runs()
    return {run.run_id: ms for run in runs if (ms := stamped(run, tag)) is not None}


def _wait_for(what: str, condition, seconds: float = 150) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.2)


# One engine path: turns and relays are Dagster's side of a run; the chaos harness runs relays on both paths.
def test_a_warm_run_hands_over_to_the_next_run_without_a_gap(incoming: Path, home: Path, tmp_path: Path) -> None:
    """A second run launched while the first is warm starts its Spark session, says it is ready and waits its turn;
    the first (a launch waits for it) stops after its current poll and releases the source; the second takes what
    arrived meanwhile as its first batch, asked for at that release. No batch of one run commits while the other
    holds the source, and every record is in once."""
    sent = make_events(50, START_MS, 60_000, seed=41, prefix="h0")
    write_jsonl(incoming / "0.jsonl", [e.json_line() for e in sent])
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    outcomes: list[subprocess.CompletedProcess[str]] = []

    def launch(run_s: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: outcomes.append(
            dagster_micro_batch(str(home), None, dagster_home=str(dagster_home), micro_batch_run_s=run_s,
                                max_files="1000")))
        thread.start()
        return thread

    runs = [launch("20")]
    raw = LakeResource(home=str(home)).table_path("raw/events")
    _wait_for("batch 1", lambda: (committed_batch(raw, "events/files") or 0) >= 1)
    runs.append(launch("30"))
    # A producer writes a file every 0.2 s from now until after the handover: the first run's last batch takes
    # a second or more, so files wait in the gap between its last poll and the second run's first.
    deadline, released_at = time.monotonic() + 150, None
    while released_at is None or time.monotonic() < released_at + 2:
        if released_at is None and _stamps(dagster_home, RELEASED_TAG):
            released_at = time.monotonic()
        ended = "\n".join(o.stdout[-3000:] + o.stderr[-3000:] for o in outcomes)
        assert released_at is not None or not outcomes, f"a run ended before the source was released:\n{ended}"
        assert time.monotonic() < deadline, "waited 150 s for the first run to release the source"
        events = make_events(5, START_MS + 60_000, 60_000, seed=len(sent), prefix=f"h{len(sent)}-")
        write_jsonl(incoming / f"{len(sent)}.jsonl", [e.json_line() for e in events])
        sent += events
        time.sleep(0.2)
    for run in runs:
        run.join(timeout=200)
    assert [o.returncode for o in outcomes] == [0, 0], "\n".join(o.stdout[-2000:] + o.stderr[-2000:] for o in outcomes)

    assert read_rows(raw, RAW) == expected_raw(sent)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        older, newer = sorted(instance.get_run_records(), key=lambda r: r.storage_id)
        batches = [[{k: v.value for k, v in e.asset_materialization.metadata.items()} for e in instance.all_logs(
            r.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)] for r in (older, newer)]
    released = stamped(older.dagster_run, RELEASED_TAG)
    ready = stamped(newer.dagster_run, READY_TAG)
    assert released is not None and ready is not None and ready <= released  # warm before the first stopped
    assert batches[0][0]["requested_by"] == "launch" and batches[1][0]["requested_by"] == "handover"
    assert batches[1][0]["requested_at_ms"] == released
    assert max(m["committed_at_ms"] for m in batches[0]) <= released < batches[1][0]["committed_at_ms"]
    assert [m["batch_id"] for m in batches[0] + batches[1]] == list(range(1, len(batches[0]) + len(batches[1]) + 1))


@pytest.mark.parametrize("split_bytes", [64, 1000])
def test_positions_are_exact_where_spark_splits_a_file(
    spark: SparkSession, incoming: Path, home: Path, split_bytes: int
) -> None:
    # Splits of 64 bytes: one starts exactly at a line (64), one exactly at a "\n" (128, an empty line).
    lines = [b"x" * 63, b"y" * 63, b"", b"  \t", *(json.dumps({"v": "z" * (i % 90)}).encode() for i in range(300)),
             b"x0B", b"\x0bx"]  # not blank: spelled like, or starting like, a blank line's characters
    (incoming / "a.jsonl").write_bytes(b"\n".join(lines))  # the last line has no "\n"
    (incoming / "b.jsonl").write_bytes(b"".join(line + b"\r\n" for line in lines[4:40]))
    (incoming / "empty.jsonl").write_bytes(b"")
    (incoming / "blank.jsonl").write_bytes(b"\n \n\r\n\x0b\x0c \t\n")
    source = source_for(builtin("events"), home)
    reader = source.reader
    plan = plan_next(source).model_copy(update={"files": tuple(reader.directory.discover(set(), 10, 2**62))})
    register_spark_functions(spark)  # as each batch does: the line offsets are one
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(split_bytes))
    try:
        scan = spark.read.text([reader.directory.path_of(e) for e in plan.files])
        assert scan.select("_metadata.file_block_start").distinct().filter("file_block_start > 0").count() > 4
        landed = [(r.source_position, bytes(r.data)) for r in reader.landed(spark, plan).collect()]
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")

    # The driver's own reading of the same bytes (onceflow.resources.files) is the reference.
    assert sorted(landed) == sorted((row.position, row.data) for row in reader.landed_rows(plan))
    assert len(landed) == 304 + 36
