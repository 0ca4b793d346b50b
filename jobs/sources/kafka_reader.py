"""The reader of a `KafkaSource`: a batch is a set of offset ranges fixed before they are read, read again as they
were on every replay. No landing copy: the log keeps every record at its offset.

The next plan starts, per partition, where the last committed batch's plan ended (read from the checkpoints, else
from the batch's own Delta commit), never from a consumer group; it ends at most at the partition's last stable
offset, so every transaction inside it is decided and `read_committed` reads the same records at any time. A
partition the last plan did not know is read from offset 0. Records the topic's retention deleted before they were
planned are an error naming them, or (under `on_lost_records="dead_letter"`) one dead-letter row per lost range.
After a commit the consumer group `onceflow-<pipeline>` gets the committed ends, for users' lag tools only.
"""

from __future__ import annotations

import json
import logging
import time
from functools import cached_property

from pyspark.sql import DataFrame, SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.durations import parse_duration
from onceflow.jobs.declare.sources import KafkaSource
from onceflow.jobs.sources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint, planned_contract
from onceflow.jobs.sources.committed_plans import CommittedPlans
from onceflow.jobs.sources.kafka_log import (
    KafkaLogChanged,
    KafkaLogTruncated,
    KafkaPositions,
    PlannedLog,
    ends_of,
    position_suffix,
    shared,
    within,
)
from onceflow.jobs.sources.kafka_watermark import KafkaWatermark
from onceflow.jobs.sources.landed_ids import LandedRow
from onceflow.jobs.sources.landing import STREAM_STRIDE, BatchOutcome, InputGone
from onceflow.resources.kafka import KafkaClient, KafkaRecord

log = logging.getLogger("onceflow")
Ranges = tuple[tuple[int, int, int], ...]


class KafkaRecordsLost(RuntimeError):
    """Records the source must read were deleted from the topic (by its retention) first."""


class KafkaReader:
    """See the module docstring; `pipeline.source` is a settings-resolved `KafkaSource`."""

    reads_ahead = True

    def __init__(
        self, pipeline: Pipeline, checkpoints: CheckpointStore, plans: CommittedPlans,
        previous: CommittedPlans | None = None,
    ) -> None:
        source = pipeline.source
        if not isinstance(source, KafkaSource) or source.max_records is None:
            raise TypeError("KafkaReader needs a settings-resolved KafkaSource")
        self.pipeline, self.source, self.checkpoints, self.plans = pipeline, source, checkpoints, plans
        self.positions = KafkaPositions(lambda: self.client, source, pipeline.name, checkpoints, plans, previous)
        self._gaps = False  # whether the last batch's offsets held fewer records than offsets (see landed_count)
        self._lags: dict[int, tuple[dict[int, int], list[int]]] = {}  # the last batch's (`_lag_after`)

    @cached_property
    def client(self) -> KafkaClient:
        return KafkaClient(self.source.servers, self.source.consumer_options())

    def _next_ranges(self, checkpoint: SourceCheckpoint) -> tuple[Ranges, Ranges, PlannedLog] | None:
        """The next batch's `(offsets, lost, log)`; None when no partition has anything new."""
        topic, position = self.source.topic, self.positions.next(checkpoint)
        starts, earliest, stable = position.starts, position.earliest, position.stable
        partitions = sorted(starts)
        lost = tuple((p, starts[p], earliest[p]) for p in partitions if starts[p] < earliest[p])
        if lost and self.source.on_lost_records == "fail":
            raise KafkaRecordsLost(_lost_message(topic, lost))
        first = {p: max(starts[p], earliest[p]) for p in partitions}
        taken = shared(self.source.max_records or 0, {p: max(0, stable[p] - first[p]) for p in partitions})
        offsets = tuple((p, first[p], first[p] + taken[p]) for p in partitions)
        if not position.first and not lost and not any(taken.values()):
            return None  # a first batch is planned even when empty: it fixes where the source starts
        return offsets, lost, position.log

    def has_data(self, checkpoint: SourceCheckpoint) -> bool:
        """Whether a batch would take records; `KafkaLogChanged` when the topic is not the log the source read
        (the source is stopped until `onceflow reset`: the sensor says so rather than start runs that fail)."""
        try:
            position = self.positions.next(checkpoint)
        except KafkaLogTruncated:
            return True  # a run asks again, then says what changed, loudly
        return position.first or any(position.stable[p] > start for p, start in position.starts.items())

    def next_plan(
        self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None, proposal: BatchPlan | None = None
    ) -> BatchPlan | None:
        plan = self.checkpoints.get_plan(checkpoint.next_batch)
        if plan is not None:
            return plan
        fresh = self.propose(checkpoint, horizon_floor_ms)
        if fresh is None:
            return None
        if fresh.lost:
            log.warning(f"{self.checkpoints.source_id}: {_lost_message(self.source.topic, fresh.lost)}; they become "
                        "dead letters (on_lost_records='dead_letter')")
        return self.checkpoints.plan(proposal if within(proposal, fresh) else fresh)

    def propose(self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None) -> BatchPlan | None:
        ranges = self._next_ranges(checkpoint)
        if ranges is None:
            return None
        offsets, lost, planned = ranges
        return BatchPlan(batch_id=checkpoint.next_batch, kind="kafka", horizon_floor_ms=horizon_floor_ms,
                         planned_at_ms=int(time.time() * 1000), offsets=offsets, lost=lost,
                         contract=planned_contract(self.pipeline), source_log=planned.text)

    def landed(self, spark: SparkSession, plan: BatchPlan) -> DataFrame:
        self._check_still_held(plan)
        topic, read = self.source.topic, [(p, start, until) for p, start, until in plan.offsets if until > start]
        suffix = position_suffix(plan)
        ordinal = "CASE partition " + " ".join(
            f"WHEN {p} THEN {index * STREAM_STRIDE - start}L + offset" for index, (p, start, _) in enumerate(read)
        ) + " END" if read else "offset"
        position = f"concat('{topic}/', partition, ':', offset, '{suffix}')"
        # A header named twice: its first value is the attribute (a Spark map cannot hold one key twice); a value
        # that is not UTF-8 is NULL (an `invalid_id` when it is the ID), never its bytes cast blindly.
        attributes = ("map_from_entries(transform(filter(transform(kafka_headers, (h, i) -> named_struct('h', h, "
                      "'i', i)), e -> NOT exists(slice(kafka_headers, 1, e.i), x -> x.key = e.h.key)), "
                      "e -> struct(e.h.key, try_validate_utf8(CAST(e.h.value AS STRING)))))"
                      if self.source.id_header is not None else "CAST(NULL AS MAP<STRING, STRING>)")
        columns = [f"{ordinal} AS ordinal", f"{position} AS source_position", "timestamp AS publish_time",
                   f"{attributes} AS attributes", "coalesce(value, X'') AS data", "key AS kafka_key",
                   "kafka_headers"]
        if read:
            records = (
                spark.read.format("kafka")
                .options(**{f"kafka.{key}": value for key, value in self.source.consumer_options().items()})
                .option("kafka.bootstrap.servers", self.source.servers)
                .option("kafka.isolation.level", "read_committed")
                .option("assign", json.dumps({topic: [p for p, _, _ in read]}))
                .option("startingOffsets", json.dumps({topic: {str(p): start for p, start, _ in read}}))
                .option("endingOffsets", json.dumps({topic: {str(p): until for p, _, until in read}}))
                .option("includeHeaders", "true")
                .load()
                .selectExpr("*", "coalesce(headers, array()) AS kafka_headers")
                .selectExpr(*columns)
            )
        else:
            records = spark.sql("SELECT CAST(NULL AS BIGINT) AS partition, CAST(NULL AS BIGINT) AS offset, "
                                "CAST(NULL AS TIMESTAMP) AS timestamp, CAST(NULL AS BINARY) AS value, "
                                "CAST(NULL AS BINARY) AS key, CAST(array() AS ARRAY<STRUCT<key: STRING, "
                                "value: BINARY>>) AS kafka_headers WHERE false").selectExpr(*columns)
        if not plan.lost:
            return records
        markers = ", ".join(f"({len(read) * STREAM_STRIDE + i}L, '{topic}/{p}:{start}-{until - 1}{suffix}')"
                            for i, (p, start, until) in enumerate(plan.lost))
        # One row per lost range, without bytes: validation makes it a `lost_in_source` dead letter.
        return records.unionByName(spark.sql(
            f"SELECT ordinal, source_position, CAST(NULL AS TIMESTAMP) AS publish_time, CAST(NULL AS MAP<STRING, "
            "STRING>) AS attributes, CAST(NULL AS BINARY) AS data, CAST(NULL AS BINARY) AS kafka_key, "
            "CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>) AS kafka_headers "
            f"FROM VALUES {markers} AS lost(ordinal, source_position)"
        ))

    def _check_still_held(self, plan: BatchPlan) -> None:
        """Records deleted after their batch was planned, or another log under the topic's name, would make its
        replays differ: say so, never skip them."""
        planned = PlannedLog.of(plan)
        if planned is not None and not planned.is_log(self.client.log(self.source.topic)):
            raise KafkaLogChanged(
                f"Kafka topic {self.source.topic!r} is not the log batch {plan.batch_id} was planned on (cluster "
                f"{planned.cluster_id} topic id {planned.topic_id}): its replays cannot read what it planned. "
                f"`onceflow reset {self.pipeline.name} --drop-uncommitted` drops the batch")
        partitions = [p for p, start, until in plan.offsets if until > start]
        earliest = self.client.offsets(self.source.topic, partitions, "earliest")
        gone = tuple((p, start, min(until, earliest[p])) for p, start, until in plan.offsets
                     if p in earliest and start < earliest[p])
        if gone:
            raise KafkaRecordsLost(
                f"{_lost_message(self.source.topic, gone)} after batch {plan.batch_id} was planned: its replays "
                f"cannot read what it planned. `onceflow reset {self.pipeline.name} --drop-uncommitted` drops the "
                "batch (its other records are planned again)"
            )

    def landed_count(self, plan: BatchPlan) -> int:
        # One record an offset, unless transaction markers, aborted transactions or compaction leave offsets
        # without one: then Spark's reading sees fewer and `recount` reads them. Reading every record again here,
        # beside Spark's read of the same broker, cost an exactly-once batch a third of its speed; it is done only
        # while the topic's last batches had such offsets (a transactional producer's topic has them in every one).
        planned = sum(until - start for _, start, until in plan.offsets) + len(plan.lost)
        if not self._gaps:
            return planned
        counted = self._read_count(plan)
        self._gaps = counted != planned
        return counted

    def recount(self, plan: BatchPlan, counted: int) -> int:
        self._gaps = True
        return self._read_count(plan)

    def _read_count(self, plan: BatchPlan) -> int:
        records = self.client.records(self.source.topic, list(plan.offsets))  # counted as read, none kept
        return sum(1 for _ in records) + len(plan.lost)

    def landed_rows(self, plan: BatchPlan) -> list[LandedRow]:
        topic, planned, suffix = self.source.topic, PlannedLog.of(plan), position_suffix(plan)
        if planned is not None and not planned.is_log(self.client.log(topic)):
            raise InputGone(f"Kafka topic {topic!r} is another log than batch {plan.batch_id} read (re-created)")
        partitions = [p for p, start, until in plan.offsets if until > start]
        earliest = self.client.offsets(topic, partitions, "earliest")
        gone = [(p, start, until) for p, start, until in plan.offsets if until > start and earliest[p] > start]
        if gone:  # a consumer would jump past them and read nothing: never a silent empty reading
            ranges = ", ".join(f"partition {p} offsets {start}..{until - 1}" for p, start, until in gone)
            raise InputGone(f"Kafka topic {topic!r} no longer holds {ranges} of batch {plan.batch_id} (retention)")
        lost = [LandedRow(f"{topic}/{p}:{start}-{until - 1}{suffix}", None, b"", None) for p, start, until in plan.lost]
        return [*(_landed_row(topic, record, suffix) for record in self._records(plan)), *lost]

    def _records(self, plan: BatchPlan) -> list[KafkaRecord]:
        return list(self.client.records(self.source.topic, list(plan.offsets)))

    def watermark(self, state: dict) -> KafkaWatermark:
        return KafkaWatermark(
            parse_duration(self.source.out_of_orderness) * 1000,
            idle_timeout_ms=parse_duration(self.pipeline.watermark_idle or "120s") * 1000,
        ).from_state(state)

    def before_batch(self, now_ms: int) -> None:
        # A transaction held open holds the watermark on an idle poll too (no batch to tell it so).
        partitions = self.client.partitions(self.source.topic)
        held = self._open(partitions, self.client.offsets(self.source.topic, partitions, "latest"))
        if not held:
            return

        def mark(checkpoint: SourceCheckpoint) -> SourceCheckpoint:
            watermark = self.watermark(checkpoint.watermark)
            watermark.observe({}, now_ms, open_=held)
            checkpoint.watermark = watermark.to_state()
            return checkpoint

        self.checkpoints.update(mark)

    def after_commit(self, watermark: KafkaWatermark, plan: BatchPlan, outcome: BatchOutcome, now_ms: int) -> None:
        read = [p for p, start, until in plan.offsets if until > start]
        if outcome.stream_max_event_ms:
            seen = {read[stream]: event_ms for stream, event_ms in outcome.stream_max_event_ms.items()
                    if stream < len(read)}
        else:  # a batch found committed in the lake: only its newest event time is known
            seen = dict.fromkeys(read, outcome.max_event_time_ms)
        # A partition with records past this batch, or a transaction open, is not idle, read or not.
        lag, held = self._lag_after(plan)
        watermark.observe({p: seen.get(p) for p in read}, now_ms, waiting=[p for p, n in lag.items() if n],
                          open_=held)

    def after_checkpoint(self, plan: BatchPlan) -> None:
        try:
            self.client.commit_group(f"onceflow-{self.pipeline.name}", self.source.topic,
                                     {p: until for p, _, until in plan.offsets})
        except Exception as error:  # lag tools only: the offsets onceflow reads from are in its plans
            log.warning(f"{self.checkpoints.source_id}: could not record consumer group offsets: {error}")

    def lag(self, plan: BatchPlan) -> dict[str, int]:
        return {f"partition_{p}": count for p, count in self._lag_after(plan)[0].items()}

    def _lag_after(self, plan: BatchPlan) -> tuple[dict[int, int], list[int]]:
        """What waits past batch `plan` per partition, and the partitions with a transaction open (asked once a
        batch: by its commit and by its run's report)."""
        if plan.batch_id not in self._lags:
            partitions = self.client.partitions(self.source.topic)
            stable = self.client.offsets(self.source.topic, partitions, "latest")
            ends = {p: until for p, _, until in plan.offsets}
            lag = {p: max(0, stable[p] - ends.get(p, 0)) for p in partitions}
            self._lags = {plan.batch_id: (lag, self._open(partitions, stable))}
        return self._lags[plan.batch_id]

    def _open(self, partitions: list[int], stable: dict[int, int]) -> list[int]:
        """The partitions whose high watermark is above their last stable offset: a transaction is open there."""
        high = self.client.offsets(self.source.topic, partitions, "high")
        return [p for p in partitions if high[p] > stable[p]]

    def backlog(self, checkpoint: SourceCheckpoint) -> str:
        last = self.positions.last_plan(checkpoint)
        ends = ends_of(last) if last else {}
        partitions = self.client.partitions(self.source.topic)
        stable = self.client.offsets(self.source.topic, partitions, "latest")
        return ", ".join(f"partition {p} lag {max(0, stable[p] - ends.get(p, 0))}" for p in partitions)

    def ensure(self) -> str:
        self.client.create_topic(self.source.topic)
        return f"Kafka topic {self.source.topic}"


def _landed_row(topic: str, record: KafkaRecord, suffix: str) -> LandedRow:
    attributes: dict[str, str | None] = {}
    for key, value in record.headers:
        attributes.setdefault(key, _text(value))
    return LandedRow(f"{topic}/{record.partition}:{record.offset}{suffix}", attributes, record.value or b"",
                     record.timestamp_ms)


def _text(value: bytes | None) -> str | None:
    """A header's value as text; None for a null one or bytes that are not UTF-8."""
    try:
        return None if value is None else value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _lost_message(topic: str, lost: tuple[tuple[int, int, int], ...]) -> str:
    ranges = ", ".join(f"partition {p} offsets {start}..{until - 1}" for p, start, until in lost)
    return (f"Kafka topic {topic!r} no longer holds {ranges} (deleted by its retention before onceflow read them); "
            "declare KafkaSource(on_lost_records='dead_letter') to accept the loss and write each range as a "
            "dead letter")
