"""Exactly-once from a Kafka topic on a real KRaft broker: offset ranges fixed before they are read, producer retries
by header, transactions, partitions added, records lost to retention. Rows read back with delta-rs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import time
import uuid
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest_job import raw_asset_key
from onceflow.jobs.sources.kafka_reader import KafkaRecordsLost
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.cli.status import source_lines
from onceflow.orchestration.cli.verify import verify
from onceflow.orchestration.deployments import LAKE, PUBSUB
from onceflow.orchestration.pipelines import resolve
from onceflow.orchestration.sensors.micro_batch import build_micro_batch_sensor
from onceflow.resources.emulators.kafka import KafkaBroker
from onceflow.resources.kafka import KafkaClient
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource
from onceflow.resources.settings import load_settings
from tests.delta_reader import read_rows
from tests.kafka_pipelines import clicks_pipeline
from tests.pipelines import dagster_micro_batch, drain

RAW = ["record_id", "user", "amount", "kafka_key", "source_position"]


@pytest.fixture
def topic(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"clicks-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, partitions=3)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_broker.bootstrap)
    monkeypatch.setenv("KAFKA_TOPIC", name)
    return name


def click(n: int, user: str | None = None) -> dict:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 600 + n)) + ".250Z"
    return {"user": user or f"u{n % 4}", "amount": f"{n}.25", "page": f"/p/{n}", "ts": ts}


def produce(producer: Producer, topic: str, items: list[tuple[int, str, bytes]]) -> None:
    """`(partition, event id, value)` records, keyed by partition, with the event id header given twice (only its
    first value counts) and a trace header."""
    for partition, event_id, value in items:
        producer.produce(topic, value=value, key=f"k{partition}".encode(), partition=partition,
                         headers=[("event_id", event_id.encode()), ("trace", b"t"), ("event_id", b"ignored")])
    producer.flush(30)


def clicks_source(home: Path, max_records: int = 1000, **kafka: str) -> SourceRuntime:
    pipeline = clicks_pipeline()
    source = dataclasses.replace(pipeline.source, max_records=max_records, **kafka)
    return open_source(resolve(dataclasses.replace(pipeline, source=source), load_settings()),
                       LakeResource(home=str(home)))


def at(topic: str, place: str) -> str:
    """A record's position in the topic as it is now: `<topic>/<place>@<topic id>`."""
    return f"{topic}/{place}@{KafkaClient(os.environ['KAFKA_BOOTSTRAP']).log(topic).topic_id}"


def expected(topic: str, rows: list[tuple[int, str, dict, int]]) -> list[tuple]:
    return sorted((event_id, body["user"], Decimal(body["amount"]), f"k{partition}".encode(),
                   at(topic, f"{partition}:{offset}")) for partition, event_id, body, offset in rows)


@pytest.mark.engine_paths
def test_three_partitions_with_retries_and_bad_records_land_once(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})
    bodies = {f"e{n}": click(n) for n in range(30)}
    first = [(n % 3, f"e{n}", json.dumps(bodies[f"e{n}"]).encode()) for n in range(30)]
    # A producer retry after a timeout: the same IDs again at new offsets, and two malformed values.
    retries = [(n % 3, f"e{n}", json.dumps(bodies[f"e{n}"]).encode()) for n in (1, 4, 7)]
    produce(producer, topic, first + retries + [(0, "bad-0", b"{not json"), (2, "bad-1", b"[1, 2]")])
    source = clicks_source(home, max_records=12)

    results = drain(lambda: spark, source)

    plans = [source.checkpoints.get_plan(r.batch_id) for r in results]
    assert [sum(until - start for _, start, until in plan.offsets) for plan in plans] == [12, 12, 11]
    assert [(p, s) for p, s, _ in plans[0].offsets] == [(0, 0), (1, 0), (2, 0)]
    for earlier, later in itertools.pairwise(plans):  # each plan starts where the one before ended
        assert [s for _, s, _ in later.offsets] == [u for _, _, u in earlier.offsets]
    offsets: dict[int, int] = {}
    landed = []
    for partition, event_id, value in first:
        landed.append((partition, event_id, json.loads(value), offsets.setdefault(partition, 0)))
        offsets[partition] += 1
    assert read_rows(source.raw_path, RAW) == expected(topic, landed)
    headers = read_rows(source.raw_path, ["record_id", "kafka_headers"])
    assert headers[0][1] == [{"key": "event_id", "value": headers[0][0].encode()}, {"key": "trace", "value": b"t"},
                             {"key": "event_id", "value": b"ignored"}]
    assert read_rows(source.dead_letter_path, ["record_id", "reason"]) == [("bad-0", "not_json"), ("bad-1", "not_json")]
    assert [r.balances() for r in results] == [True] * 3
    assert sum(r.inserted for r in results) == 30 and sum(r.duplicates for r in results) == 3
    assert run_micro_batch(lambda: spark, source) is None  # nothing new: no batch
    # The consumer group holds the committed ends, for lag tools.
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    group = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("onceflow-clicks")])["onceflow-clicks"]
    # (Other tests' topics share the group: a pipeline's group is named after it.)
    assert sorted((tp.partition, tp.offset) for tp in group.result(30).topic_partitions if tp.topic == topic) == [
        (p, until) for p, _, until in plans[-1].offsets]


@pytest.mark.engine_paths
def test_a_kafka_batch_read_ahead_is_recorded_though_more_arrived_since(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})

    def send(numbers: range) -> None:
        produce(producer, topic, [(0, f"ra-{n}", json.dumps(click(n)).encode()) for n in numbers])

    send(range(12))
    source = clicks_source(home, max_records=8)
    first = run_micro_batch(lambda: spark, source)
    proposal = source.read_ahead.proposal
    assert first is not None and proposal is not None
    assert [(p, start, until) for p, start, until in proposal.offsets if until > start] == [(0, 8, 12)]
    assert source.checkpoints.get_plan(proposal.batch_id) is None  # nothing is recorded for a read ahead
    source.read_ahead.settle()
    send(range(12, 21))  # after the read ahead: the next plan would now take offsets 8-16

    # Offsets 8-12 hold the records read ahead whatever arrived since: the batch is that smaller one.
    second = run_micro_batch(lambda: spark, source)
    assert second is not None and (second.batch_id, second.inserted) == (proposal.batch_id, 4)
    assert source.checkpoints.get_plan(second.batch_id) == proposal
    rest = drain(lambda: spark, source)
    assert [r.inserted for r in rest] == [8, 1] and all(r.balances() for r in [first, second, *rest])
    ids = [row[0] for row in read_rows(source.raw_path, ["record_id"])]
    assert sorted(ids) == sorted(f"ra-{n}" for n in range(21))
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    group = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("onceflow-clicks")])["onceflow-clicks"]
    assert [(tp.partition, tp.offset) for tp in group.result(30).topic_partitions
            if tp.topic == topic and tp.partition == 0] == [(0, 21)]


@pytest.mark.engine_paths
def test_aborted_and_open_transactions_never_enter_raw(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    def transactional(tx_id: str) -> Producer:
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": tx_id})
        producer.init_transactions(30)
        return producer

    committed, aborted = transactional(f"{topic}-a"), transactional(f"{topic}-b")
    rows = []
    for round_ in range(3):  # committed and aborted transactions interleaved on partition 0
        for producer, kind in ((committed, "ok"), (aborted, "aborted")):
            producer.begin_transaction()
            for n in range(2):
                event_id = f"{kind}-{round_}-{n}"
                producer.produce(topic, value=json.dumps(click(round_ * 10 + n)).encode(), partition=0,
                                 headers=[("event_id", event_id.encode())])
                rows.append(event_id)
            producer.flush(30)
            (producer.commit_transaction if kind == "ok" else producer.abort_transaction)(30)
    # One left open while the batch is planned and read: it must not change what the batch holds.
    committed.begin_transaction()
    committed.produce(topic, value=json.dumps(click(99)).encode(), partition=0, headers=[("event_id", b"late-0")])
    committed.flush(30)
    source = clicks_source(home)

    first = run_micro_batch(lambda: spark, source)
    first_stable = KafkaClient(kafka_broker.bootstrap).offsets(topic, [0], "latest")[0]

    assert first is not None and first.inserted == 6 and first.landed == 6 and first.balances()
    committed.commit_transaction(30)
    # The coordinator writes the commit marker after it answers: wait until the stable offset has passed it.
    stable_after = first_stable + 2  # the late record, then its transaction's marker
    deadline = time.monotonic() + 30
    while KafkaClient(kafka_broker.bootstrap).offsets(topic, [0], "latest")[0] < stable_after:
        assert time.monotonic() < deadline, "the committed transaction's marker never became stable"
        time.sleep(0.2)
    second = run_micro_batch(lambda: spark, source)
    assert second is not None and second.inserted == 1
    assert [r[0] for r in read_rows(source.raw_path, ["record_id"])] == sorted(
        [e for e in rows if e.startswith("ok-")] + ["late-0"])
    assert read_rows(source.dead_letter_path, ["record_id"]) == []


@pytest.mark.engine_paths
def test_a_partition_added_while_running_is_read_from_its_first_offset(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    produce(producer, topic, [(n % 3, f"e{n}", json.dumps(click(n)).encode()) for n in range(6)])
    source = clicks_source(home)
    assert len(drain(lambda: spark, source)) == 1
    kafka_broker.add_partitions(topic, 4)
    produce(Producer({"bootstrap.servers": kafka_broker.bootstrap}), topic,
            [(3, "new-0", json.dumps(click(40)).encode()), (3, "new-1", json.dumps(click(41)).encode())])

    results = drain(lambda: spark, source)

    assert [r.inserted for r in results] == [2]
    assert source.checkpoints.get_plan(results[0].batch_id).offsets[3] == (3, 0, 2)
    assert [r for r in read_rows(source.raw_path, ["record_id", "source_position"]) if r[0].startswith("new")] == [
        ("new-0", at(topic, "3:0")), ("new-1", at(topic, "3:1"))]


@pytest.mark.engine_paths
@pytest.mark.parametrize("on_lost", ["fail", "dead_letter"])
def test_records_deleted_by_retention_before_they_are_read_are_never_silent(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path, on_lost: str
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    produce(producer, topic, [(0, f"e{n}", json.dumps(click(n)).encode()) for n in range(4)])
    source = clicks_source(home, on_lost_records=on_lost)
    assert [r.inserted for r in drain(lambda: spark, source)] == [4]
    produce(producer, topic, [(0, f"e{n}", json.dumps(click(n)).encode()) for n in range(4, 10)])
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 7)])[TopicPartition(topic, 0, 7)].result(30)

    if on_lost == "fail":
        with pytest.raises(KafkaRecordsLost, match=r"partition 0 offsets 4\.\.6 .*on_lost_records='dead_letter'"):
            run_micro_batch(lambda: spark, source)
        assert source.checkpoints.load().committed_batch == 1
        return
    result = run_micro_batch(lambda: spark, source)
    assert result is not None and result.inserted == 3 and result.balances()
    assert [r[0] for r in read_rows(source.raw_path, ["record_id"])] == ["e0", "e1", "e2", "e3", "e7", "e8", "e9"]
    assert read_rows(source.dead_letter_path, ["source_position", "reason"]) == [
        (at(topic, "0:4-6"), "lost_in_source")]


def mixed_records(count: int, prefix: str = "e") -> list[tuple[int, str, bytes]]:
    """`count` clicks over three partitions, a retry of every fifth, and a malformed value every tenth."""
    items = []
    for n in range(count):
        items.append((n % 3, f"{prefix}{n}", json.dumps(click(n)).encode()))
        if n % 5 == 4:
            items.append(((n + 1) % 3, f"{prefix}{n}", json.dumps(click(n)).encode()))
        if n % 10 == 9:
            items.append((n % 3, f"{prefix}bad{n}", b'{"user": '))
    return items


def landed_once(source: SourceRuntime, ids: list[str]) -> None:
    """Raw holds each valid ID exactly once and the dead-letter table each malformed one."""
    raw = [r[0] for r in read_rows(source.raw_path, ["record_id"])]
    assert raw == sorted(i for i in set(ids) if "bad" not in i)
    assert [r[0] for r in read_rows(source.dead_letter_path, ["record_id"])] == sorted(i for i in ids if "bad" in i)


@pytest.mark.engine_paths
@pytest.mark.parametrize("crash_at", ["ingest.after_dead_letters", "ingest.after_merge"])
def test_a_run_killed_at_each_ingest_crash_point_is_replayed_to_the_same_rows(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path, crash_at: str
) -> None:
    items = mixed_records(20)
    produce(Producer({"bootstrap.servers": kafka_broker.bootstrap}), topic, items)

    crashed = dagster_micro_batch(str(home), crash_at, pipeline="clicks", pipelines="tests.kafka_pipelines")

    assert f"crash injected at {crash_at}" in crashed.stderr + crashed.stdout, crashed.stderr[-3000:]
    source = clicks_source(home)
    results = drain(lambda: spark, source)
    assert [(r.batch_id, r.replayed) for r in results] == [(1, crash_at == "ingest.after_merge")]
    landed_once(source, [event_id for _, event_id, _ in items])
    assert source.checkpoints.load().committed_batch == 1


@pytest.mark.engine_paths
def test_a_checkpoint_restored_from_an_old_copy_changes_no_row(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    items = mixed_records(24)
    produce(producer, topic, items[:12])
    source = clicks_source(home, max_records=6)
    assert len(drain(lambda: spark, source)) == 1 + (len(items[:12]) - 1) // 6
    backup = home / "checkpoints-backup"
    shutil.copytree(home / "checkpoints", backup)
    produce(producer, topic, items[12:])
    drain(lambda: spark, source)
    shutil.rmtree(home / "checkpoints")
    shutil.copytree(backup, home / "checkpoints")  # the old copy comes back; the lake is batches ahead of it
    later = mixed_records(6, prefix="x")
    produce(producer, topic, later)

    results = drain(lambda: spark, source)

    assert results and results[0].realigned_from is not None
    landed_once(source, [event_id for _, event_id, _ in items + later])


@pytest.mark.engine_paths
def test_dagster_asks_for_batches_while_offsets_are_ahead_and_shows_each_partitions_lag(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    items = mixed_records(12)
    produce(Producer({"bootstrap.servers": kafka_broker.bootstrap}), topic, items)
    monkeypatch.setenv("KAFKA_MAX_RECORDS", "6")
    pipeline = resolve(clicks_pipeline(), load_settings())
    lake = LakeResource(home=str(home))
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    with dg.instance_for_test(temp_dir=str(dagster_home)) as instance:
        resources = {LAKE: lake, PUBSUB: PubSubResource(project="unused")}
        context = dg.build_sensor_context(instance=instance, resources=resources)
        [request] = build_micro_batch_sensor(pipeline, idle_tick_s=15)(context).run_requests
        assert request.run_key == "clicks:batch:1"

        ran = dagster_micro_batch(str(home), None, pipeline="clicks", dagster_home=str(dagster_home),
                                  pipelines="tests.kafka_pipelines")

        assert ran.returncode == 0, ran.stderr[-3000:]
        event = instance.get_latest_materialization_event(raw_asset_key(pipeline))
        metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    source = open_source(pipeline, lake)
    plan = source.checkpoints.get_plan(1)
    ends = {p: until for p, _, until in plan.offsets}
    totals = {p: sum(1 for partition, _, _ in items if partition == p) for p in range(3)}
    assert {k: v for k, v in metadata.items() if k.startswith("lag_")} == {
        f"lag_partition_{p}": totals[p] - ends[p] for p in range(3)}
    assert sum(ends.values()) == 6
    [backlog] = [line for line in source_lines(source) if "backlog" in line]
    assert backlog.endswith(", ".join(f"partition {p} lag {totals[p] - ends[p]}" for p in range(3)))

    drain(lambda: spark, source)

    assert not source.reader.has_data(source.checkpoints.load())
    assert verify(spark, [pipeline], lake), capsys.readouterr().out
    landed_once(source, [event_id for _, event_id, _ in items])


@pytest.mark.engine_paths
def test_a_pipeline_starting_at_latest_reads_only_what_comes_after_its_first_batch(
    spark: SparkSession, kafka_broker: KafkaBroker, topic: str, home: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    produce(producer, topic, [(n % 3, f"old{n}", json.dumps(click(n)).encode()) for n in range(3)])
    source = clicks_source(home, starting_offsets="latest")

    first = run_micro_batch(lambda: spark, source)  # planned though empty: it fixes where "latest" was

    assert first is not None and (first.landed, first.inserted) == (0, 0) and first.balances()
    assert source.checkpoints.get_plan(first.batch_id).offsets == ((0, 1, 1), (1, 1, 1), (2, 1, 1))
    produce(producer, topic, [(n % 3, f"new{n}", json.dumps(click(n)).encode()) for n in range(2)])
    assert [r.inserted for r in drain(lambda: spark, source)] == [2]
    assert read_rows(source.raw_path, ["record_id"]) == [("new0",), ("new1",)]
