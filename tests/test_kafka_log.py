"""A Kafka topic that is not one append-only log: re-created under its name, a plan that lacks a partition, a reset
of a pipeline that starts at `latest`, ID headers that are empty or not UTF-8. Staged on a real KRaft broker, from
the command line where an operator would act; rows read back with delta-rs."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from pyspark.sql import SparkSession

from onceflow.jobs.sources.checkpoint import BatchPlan
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.emulators.kafka import KafkaBroker
from onceflow.resources.settings import load_settings
from tests.delta_reader import read_rows
from tests.kafka_pipelines import clicks_pipeline
from tests.pipelines import dagster_micro_batch, drain, onceflow_cli, sensor_wants
from tests.test_kafka_source import click, clicks_source, produce


@pytest.fixture
def topic(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"clicks-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, partitions=3)
    for variable, value in (("KAFKA_BOOTSTRAP", kafka_broker.bootstrap), ("KAFKA_TOPIC", name),
                            ("ONCEFLOW_PIPELINES", "tests.kafka_pipelines")):
        monkeypatch.setenv(variable, value)
    return name


def records(producer: Producer, topic: str, prefix: str, count: int) -> list[str]:
    produce(producer, topic, [(n % 3, f"{prefix}{n}", json.dumps(click(n)).encode()) for n in range(count)])
    return [f"{prefix}{n}" for n in range(count)]


def recreate(broker: KafkaBroker, topic: str, timeout_s: float = 60) -> None:
    """Delete the topic and create it again under its name, as an operator would."""
    admin = broker.admin()  # held while its future is: a client collected first destroys its handle
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            broker.create_topic(topic, partitions=3)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # still being deleted


def users(home: Path) -> list[str]:
    return sorted(r[0] for r in read_rows(str(home / "lake" / "raw" / "clicks"), ["user"]))


def test_a_topic_recreated_under_its_name_stops_the_source_and_reset_reads_the_new_log_whole(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_ID_HEADER", "")  # IDs are positions: the case a re-created log collides with
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    records(producer, topic, "old", 150)
    assert sum(r.inserted for r in drain(lambda: spark, clicks_source(home, max_records=100))) == 150

    recreate(kafka_broker, topic)
    records(producer, topic, "new", 100)  # its offsets start at 0 again, below where the old log ended
    # The sensor starts no run that would fail (each would hold the source, and make the reset wait): it says why.
    stopped = sensor_wants(home, pipeline=resolve(clicks_pipeline(), load_settings()))
    assert stopped.startswith("the source is stopped: Kafka topic") and "onceflow reset clicks" in stopped, stopped
    failed = dagster_micro_batch(str(home), None, pipeline="clicks")  # a run started by hand fails, naming it
    assert failed.returncode != 0
    assert "KafkaLogChanged" in failed.stdout + failed.stderr and "onceflow reset clicks" in failed.stdout + failed.stderr
    assert len(users(home)) == 150  # nothing of the new log taken silently

    reset = onceflow_cli(["reset", "clicks"])
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert sensor_wants(home, pipeline=resolve(clicks_pipeline(), load_settings())) == "new data"
    assert sum(r.inserted for r in drain(lambda: spark, clicks_source(home, max_records=100))) == 100
    raw = read_rows(str(home / "lake" / "raw" / "clicks"), ["record_id"])
    assert len(raw) == 250 == len({r[0] for r in raw})  # none of the new taken for a duplicate of the old
    done = onceflow_cli(["verify"])
    assert done.returncode == 0 and "clicks: exactly-once holds" in done.stdout, done.stdout + done.stderr


def test_a_partition_missing_from_the_last_plan_goes_on_where_an_earlier_plan_ended_it(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    records(producer, topic, "a", 30)
    source = clicks_source(home, max_records=1000)
    (first,) = drain(lambda: spark, source)
    records(producer, topic, "b", 3)  # one more record in each partition
    drain(lambda: spark, source)
    # The last plan as one made without partition 2 (a plan restored from an older copy, an older release).
    plan = source.checkpoints.get_plan(first.batch_id + 1)
    plan = BatchPlan.model_validate({**plan.to_dict(), "offsets": [r for r in plan.to_dict()["offsets"] if r[0] != 2]})
    source.checkpoints.replace_plan(plan)
    records(producer, topic, "c", 3)
    (next_batch,) = drain(lambda: spark, source)
    ranges = {p: (start, until) for p, start, until in source.checkpoints.get_plan(next_batch.batch_id).offsets}
    # From where the plan before ended it, not from offset 0: only what the edited plan hid is read again (and
    # deduplicated by its ID header).
    assert ranges[2] == (10, 12)
    assert next_batch.inserted == 3 and next_batch.duplicates == 1


def test_a_reset_of_a_pipeline_starting_at_latest_skips_nothing_of_its_log(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_STARTING", "latest")
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    records(producer, topic, "before", 3)
    source = clicks_source(home, starting_offsets="latest")
    drain(lambda: spark, source)  # fixes where `latest` was
    kept = records(producer, topic, "kept", 6)
    drain(lambda: spark, source)
    between = records(producer, topic, "between", 6)  # after the epoch's last batch, before the reset
    reset = onceflow_cli(["reset", "clicks"])
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert sensor_wants(home, pipeline=resolve(clicks_pipeline(), load_settings())) == "new data"
    after = records(producer, topic, "after", 3)
    drain(lambda: spark, clicks_source(home, starting_offsets="latest"))
    assert sorted(r[0] for r in read_rows(source.raw_path, ["record_id"])) == sorted(kept + between + after)


def test_an_empty_or_undecodable_id_header_is_an_invalid_id_dead_letter(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    body = json.dumps(click(1)).encode()
    for n, header in enumerate([b"", b"\xff\xfe", b"", None, b"\xc3\x28", b"ok-1"]):
        producer.produce(topic, value=body, partition=0, headers=[("event_id", header), ("n", str(n).encode())])
    producer.flush(30)
    source = clicks_source(home)
    (result,) = drain(lambda: spark, source)
    assert (result.inserted, result.dead_lettered.get("invalid_id")) == (1, 5)
    dead = read_rows(source.dead_letter_path, ["record_id", "reason"])
    assert len({r[0] for r in dead}) == 5 and {r[1] for r in dead} == {"invalid_id"}  # each its own, by position
    assert read_rows(source.raw_path, ["record_id"]) == [("ok-1",)]


def test_a_partition_that_ends_below_what_was_read_stops_the_source_after_asking_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onceflow.jobs.sources import kafka_log

    monkeypatch.setattr(kafka_log, "TRUNCATION_WAIT_S", 0.0)
    answers = iter([{0: 5, 1: 9}, {0: 5, 1: 12}])  # a new leader answering low for a moment, then not
    assert kafka_log.check_not_truncated({0: 5, 1: 12}, lambda: next(answers), "t", 4, "clicks") == {0: 5, 1: 12}
    with pytest.raises(kafka_log.KafkaLogTruncated, match=r"partition 1 ends at 9, below 12.*onceflow reset clicks"):
        kafka_log.check_not_truncated({0: 5, 1: 12}, lambda: {0: 5, 1: 9}, "t", 4, "clicks")
    # After the reset, the new epoch's records carry the next generation of the log in their positions.
    planned = kafka_log.PlannedLog("cluster", "topic-id", 1)
    plan = BatchPlan(batch_id=5, kind="kafka", horizon_floor_ms=None, planned_at_ms=0, source_log=planned.text)
    assert kafka_log.PlannedLog.of(plan) == planned and kafka_log.position_suffix(plan) == "@topic-id~1"
