"""`onceflow verify` on what real sources and producers do: event times with microseconds, processed files archived,
Kafka records deleted by retention, a home it cannot read. Run as an operator runs it (its own process); it exits 0
when exactly-once held, 1 on a mismatch, 2 on an error it names, and never raises on data."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from onceflow.jobs.verify.tables import epoch_ms
from onceflow.orchestration.cli.verify import verify
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.emulators.kafka import KafkaBroker
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings
from tests.pipelines import builtin, drain, events_from_files, onceflow_cli
from tests.test_kafka_source import clicks_source, produce


def iso_us(ms: int, micros: int) -> str:
    """An event time as `datetime.isoformat()` writes one: with microseconds."""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(microsecond=micros).isoformat()


def write_lines(path: Path, base_ms: int, prefix: str, count: int) -> None:
    lines = [json.dumps({"event_id": f"{prefix}{i}", "event_time": iso_us(base_ms + i * 1000, 123_456 + i),
                         "key": f"k{i % 3}", "value": i}) for i in range(count)]
    path.write_text("".join(f"{line}\n" for line in [*lines, lines[0]]))  # and a producer's retry


@pytest.fixture
def files_home(spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The built-in `events` over files with microsecond event times, two batches ingested."""
    directory = events_from_files(tmp_path, monkeypatch, max_files=1)
    base = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000
    write_lines(directory / "a.jsonl", base, "a", 30)
    write_lines(directory / "b.jsonl", base + 60_000, "b", 30)
    assert [r.inserted for r in drain(lambda: spark, _source(home))] == [30, 30]
    return directory


def _source(home: Path):
    from onceflow.jobs.sources.reader import open_source

    return open_source(builtin("events"), LakeResource(home=str(home)))


def test_verify_reads_microsecond_event_times_and_exits_0(files_home: Path) -> None:
    done = onceflow_cli(["verify"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "events: exactly-once holds" in done.stdout and "Traceback" not in done.stderr


def test_status_and_verify_speak_json_for_the_pipelines_named(files_home: Path, home: Path) -> None:
    status = onceflow_cli(["status", "--json", "--pipeline", "events"])
    assert status.returncode == 0, status.stderr
    (events,) = json.loads(status.stdout)["pipelines"]
    assert (events["pipeline"], events["source"], events["committed_batch"]) == ("events", "events/files", 2)
    assert events["totals"]["inserted"] == 60 and events["totals"]["duplicates"] == 2
    assert [o["asset"] for o in events["outputs"]] == ["event_counts"]

    DeltaTable(str(home / "lake" / "raw" / "events")).delete("record_id = 'b7'")
    done = onceflow_cli(["verify", "--json", "--pipeline", "events"])
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["holds"] is False and [p["pipeline"] for p in report["pipelines"]] == ["events"]
    (verdict,) = report["pipelines"]
    assert verdict["lost"] == {"count": 1, "ids": ["b7"]} and verdict["doubled_raw"]["count"] == 0
    windows = verdict["outputs"]["event_counts"]
    assert sum(w["received"] for w in windows) == 62 and sum(w["inserted"] for w in windows) == 59
    assert sum(w["duplicates"] for w in windows) == 2

    for command in ("status", "verify"):
        unknown = onceflow_cli([command, "--pipeline", "nope"])
        assert unknown.returncode == 2 and "no pipeline 'nope': the pipelines are events" in unknown.stderr


def test_verify_checks_archived_files_from_their_manifests_and_still_finds_a_loss(
    files_home: Path, home: Path, tmp_path: Path
) -> None:
    shutil.move(files_home, tmp_path / "archive")  # an operator archives what was processed
    done = onceflow_cli(["verify"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "events: 2 batches checked from their ID manifests: input gone: FileChangedError (2); batches 1-2" \
        in done.stdout
    # The manifests are a check, not a rubber stamp: a record removed from raw is still missed.
    DeltaTable(str(home / "lake" / "raw" / "events")).delete("record_id = 'b7'")
    done = onceflow_cli(["verify"])
    assert done.returncode == 1 and "events: 1 record IDs lost (landed, held nowhere): b7" in done.stdout


def test_batches_with_neither_input_nor_manifest_are_counted_not_failed(files_home: Path, home: Path, tmp_path: Path) -> None:
    shutil.move(files_home, tmp_path / "archive")
    shutil.rmtree(home / "manifests")  # batches committed before manifests were kept
    done = onceflow_cli(["verify"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "events: 2 batches not re-checkable (counted as the tables hold them): input gone: FileChangedError (2)" \
        in done.stdout


def test_verify_names_an_error_and_exits_2(files_home: Path, home: Path) -> None:
    (checkpoint,) = (home / "checkpoints").rglob("checkpoint.json")
    checkpoint.write_text("{not json")
    done = onceflow_cli(["verify"])
    assert done.returncode == 2
    assert "onceflow verify: could not reconcile: InvalidStoredState" in done.stderr and str(checkpoint) in done.stderr
    assert "Traceback" not in done.stderr


def test_every_precision_is_floored_to_its_millisecond() -> None:
    # 1969-12-31T23:59:59.9985 and 1970-01-01T00:00:01.0015, and a null, in each unit a table may hold.
    for unit, per_ms in (("ms", 1), ("us", 1000), ("ns", 1_000_000)):
        ticks = [-1500 * per_ms // 1000, 1_001_500 * per_ms // 1000, None]
        column = pa.array(ticks, pa.timestamp(unit, tz="UTC"))
        assert epoch_ms(column).to_pylist() == [-2, 1001, None], unit
    assert epoch_ms(pa.array([-1, 2], pa.timestamp("s"))).to_pylist() == [-1000, 2000]


def test_each_pipelines_verdict_speaks_for_that_pipeline(
    spark: SparkSession, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from onceflow.jobs.declare.declaration import Pipeline
    from onceflow.jobs.declare.sources import FileSource
    from onceflow.jobs.sources.reader import open_source
    from onceflow.orchestration.pipelines.events import SCHEMA

    base = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000
    lake, pipelines = LakeResource(home=str(home)), []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        write_lines(tmp_path / name / "a.jsonl", base, name, 10)
        source = FileSource(directory=str(tmp_path / name), id_field="event_id", timestamp_field="event_time")
        pipelines.append(resolve(Pipeline(name=name, source=source, schema=SCHEMA), load_settings()))
        drain(lambda: spark, open_source(pipelines[-1], lake))
    DeltaTable(lake.table_path("raw/first")).delete("record_id = 'first3'")
    assert not verify(spark, pipelines, lake)
    out = capsys.readouterr().out
    assert "first: exactly-once VIOLATED" in out and "second: exactly-once holds" in out


def test_kafka_offsets_deleted_by_retention_are_checked_from_the_manifests(
    spark: SparkSession, kafka_broker: KafkaBroker, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=3)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_broker.bootstrap)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 600))
    items = [(n % 3, f"e{n}", json.dumps({"user": f"u{n}", "amount": "1.50", "ts": f"{stamp}.{n:06d}Z"}).encode())
             for n in range(30)]
    produce(producer, topic, items)
    source = clicks_source(home, max_records=12)
    assert sum(r.inserted for r in drain(lambda: spark, source)) == 30
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    deleted = {TopicPartition(topic, p, 10): None for p in range(3)}
    for future in admin.delete_records(list(deleted)).values():
        future.result(30)
    done = onceflow_cli(["verify"], ONCEFLOW_PIPELINES="tests.kafka_pipelines", KAFKA_MAX_RECORDS="12")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "clicks: 3 batches checked from their ID manifests: input gone: InputGone (3); batches 1-3" in done.stdout
    assert "clicks: exactly-once holds" in done.stdout

