"""Which Kafka log a source reads, and where it stands in it: what keeps a Kafka source exactly-once when the log is
not one append-only log (a topic re-created under its name, a DR replica, an unclean leader election).

Every plan names the log it reads (`BatchPlan.source_log`): `<cluster id>/<topic id>`, the ids Kafka gives a
cluster and each topic it creates (KIP-516), and `~<generation>` once a log went back. A record's position, its ID
unless the source declares one, carries the log's part after the cluster: `<topic>/<partition>:<offset>@<topic id>`,
so the records of a re-created topic are never taken for the old topic's at the same offsets.

Before each plan, the log is compared with the one the last committed plan read: another log under the topic's
name (`KafkaLogChanged`), or a partition that now ends below where onceflow read up to (`KafkaLogTruncated`, asked
again a few times first: a new leader may answer low for a moment), stop the source with an error naming what
changed and the way out, `onceflow reset <pipeline>`. An epoch's first plan continues on the log the epoch before
it read, where that epoch ended (a reset never skips nor re-reads records of the same log), a generation further
where the log went back (new records at offsets read before are new records); on another log, from the source's
`starting_offsets`.

Each plan lists every partition onceflow has planned, so where each one ended carries forward even through a plan
made while a partition was unknown; where a plan lacks a partition (made before plans carried them all), its end is
looked up in the plans before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from onceflow.jobs.declare.sources import KafkaSource
from onceflow.jobs.sources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint
from onceflow.jobs.sources.committed_plans import CommittedPlans
from onceflow.resources.kafka import KafkaClient, KafkaLog

log = logging.getLogger("onceflow")
TRUNCATION_CHECKS = 3
TRUNCATION_WAIT_S = 2.0


class KafkaPositionUnknown(RuntimeError):
    """Neither the checkpoints nor the lake hold the plan of the source's last committed batch."""


class KafkaLogChanged(RuntimeError):
    """The topic a source reads is not the log its batches read (re-created, or on another cluster)."""


class KafkaLogTruncated(RuntimeError):
    """A partition of the source's topic ends below where onceflow read it up to: the log lost records it held."""


@dataclass(frozen=True)
class PlannedLog:
    """A plan's `source_log`, read: the cluster, the topic id and the generation (0 until the log went back)."""

    cluster_id: str
    topic_id: str
    generation: int = 0

    @classmethod
    def of(cls, plan: BatchPlan) -> PlannedLog | None:
        if plan.source_log is None:
            return None
        cluster, _, topic = plan.source_log.partition("/")
        topic_id, _, generation = topic.partition("~")
        return cls(cluster, topic_id, int(generation or 0))

    @classmethod
    def now(cls, current: KafkaLog, generation: int = 0) -> PlannedLog:
        return cls(current.cluster_id, current.topic_id, generation)

    def is_log(self, current: KafkaLog) -> bool:
        return (self.cluster_id, self.topic_id) == (current.cluster_id, current.topic_id)

    @property
    def text(self) -> str:
        """As a plan holds it."""
        return f"{self.cluster_id}/{self.position_tag}"

    @property
    def position_tag(self) -> str:
        """What positions on this log carry after their offset's `@`."""
        return self.topic_id + (f"~{self.generation}" if self.generation else "")


def position_suffix(plan: BatchPlan) -> str:
    """What a position of `plan`'s records carries after its offset: `@<topic id>[~<generation>]`, or nothing in a
    plan made before plans named their log."""
    planned = PlannedLog.of(plan)
    return "" if planned is None else f"@{planned.position_tag}"


def ends_of(plan: BatchPlan) -> dict[int, int]:
    """Where `plan` ended, per partition it names."""
    return {p: until for p, _, until in (*plan.lost, *plan.offsets)}


def carried_ends(
    last: BatchPlan, partitions: list[int], earlier: Callable[[int], BatchPlan | None], first_batch: int
) -> dict[int, int]:
    """Where each partition ended, from `last` (the last committed plan); a partition it lacks is looked up in the
    plans before it (`earlier(batch)`, back to the epoch's `first_batch`): only a partition no plan names is new."""
    ends = ends_of(last)
    missing = [p for p in partitions if p not in ends]
    batch = last.batch_id - 1
    while missing and batch >= first_batch:
        plan = earlier(batch)
        found = {} if plan is None else {p: e for p, e in ends_of(plan).items() if p in missing}
        if found:
            log.warning(f"batch {last.batch_id}'s plan lacks partitions {sorted(found)}; they go on where batch "
                        f"{batch} ended them")
        ends |= found
        missing = [p for p in missing if p not in found]
        batch -= 1
    return ends


def check_same_log(planned: PlannedLog | None, current: KafkaLog, topic: str, batch: int, pipeline: str) -> None:
    """`KafkaLogChanged` unless `current` is the log batch `batch` read (`planned`; None: not recorded then)."""
    if planned is None or planned.is_log(current):
        return
    raise KafkaLogChanged(
        f"Kafka topic {topic!r} is not the log pipeline {pipeline!r} read: batch {batch} read cluster "
        f"{planned.cluster_id} topic id {planned.topic_id}, the topic is now cluster {current.cluster_id} topic id "
        f"{current.topic_id} (re-created under its name, or another cluster). Nothing of it is read until `onceflow "
        f"reset {pipeline}` starts a new epoch on it, from `starting_offsets`; its records are new records (their "
        "positions carry its topic id), the old log's stay as committed"
    )


def check_not_truncated(
    ends: dict[int, int], stable: Callable[[], dict[int, int]], topic: str, batch: int, pipeline: str
) -> dict[int, int]:
    """The partitions' last stable offsets (`stable()`), once none is below where batch `batch` ended them
    (`ends`); `KafkaLogTruncated` when one still is after `TRUNCATION_CHECKS` readings."""
    for attempt in range(TRUNCATION_CHECKS):
        offsets = stable()
        behind = {p: (offsets[p], end) for p, end in ends.items() if p in offsets and offsets[p] < end}
        if not behind:
            return offsets
        if attempt < TRUNCATION_CHECKS - 1:
            time.sleep(TRUNCATION_WAIT_S)
    went_back = ", ".join(f"partition {p} ends at {now}, below {end}" for p, (now, end) in sorted(behind.items()))
    raise KafkaLogTruncated(
        f"Kafka topic {topic!r} went back: {went_back}, where batch {batch} of pipeline {pipeline!r} had read up to "
        f"(an unclean leader election, or a restore): the log lost records onceflow holds. `onceflow reset {pipeline}` "
        "starts a new epoch where each partition now ends; records written there from then on are new records (a new "
        "log generation in their positions), none taken for a duplicate of the ones the log lost"
    )


@dataclass(frozen=True)
class Position:
    """Where the next plan starts per partition (`starts`), on which log, the partitions' earliest and last stable
    offsets, and whether it is the epoch's first plan (planned even when empty: it fixes where the epoch starts)."""

    starts: dict[int, int]
    log: PlannedLog
    earliest: dict[int, int]
    stable: dict[int, int]
    first: bool


class KafkaPositions:
    """Where a Kafka source's next plan starts, from its committed plans (`plans`, this epoch's; `previous`, the
    epoch before's, where this epoch's first plan goes on) and what the cluster (`client()`) holds now."""

    def __init__(
        self, client: Callable[[], KafkaClient], source: KafkaSource, pipeline: str, checkpoints: CheckpointStore,
        plans: CommittedPlans, previous: CommittedPlans | None,
    ) -> None:
        self._client, self.source, self.pipeline = client, source, pipeline
        self.checkpoints, self.plans, self.previous = checkpoints, plans, previous

    @property
    def client(self) -> KafkaClient:
        return self._client()

    def last_plan(self, checkpoint: SourceCheckpoint) -> BatchPlan | None:
        """The plan of the last batch the checkpoint holds committed; None before the epoch's first batch."""
        last = checkpoint.committed_batch
        if last < self.checkpoints.first_batch:
            return None
        plan = self.plans.plan_of(last)
        if plan is None:
            raise KafkaPositionUnknown(f"{self.checkpoints.source_id}: no plan of committed batch {last} in the "
                                       "checkpoints or the lake, so the next offsets are unknown")
        return plan

    @cached_property
    def _previous_plan(self) -> BatchPlan | None:
        """The last plan the epoch before this one committed (None in the first epoch)."""
        if self.previous is None:
            return None
        for batch in range(self.checkpoints.first_batch - 1, self.previous.checkpoints.first_batch - 1, -1):
            plan = self.previous.plan_of(batch)
            if plan is not None and plan.kind == "kafka":
                return plan
        return None

    def next(self, checkpoint: SourceCheckpoint) -> Position:
        """Where the next plan starts, on which log (see `onceflow.jobs.sources.kafka_log`); raises when the topic
        is another log than the last plan read, or went back below it."""
        topic, name = self.source.topic, self.pipeline
        current, partitions = self.client.log(topic), self.client.partitions(topic)
        earliest = self.client.offsets(topic, partitions, "earliest")

        def stable() -> dict[int, int]:
            return self.client.offsets(topic, partitions, "latest")

        last = self.last_plan(checkpoint)
        if last is not None:
            planned = PlannedLog.of(last)
            check_same_log(planned, current, topic, last.batch_id, name)
            ends = carried_ends(last, partitions, self.plans.plan_of, self.checkpoints.first_batch)
            offsets = check_not_truncated(ends, stable, topic, last.batch_id, name)
            # A partition no plan names was added since: from its first offset.
            return Position({p: ends.get(p, 0) for p in partitions}, planned or PlannedLog.now(current),
                             earliest, offsets, first=False)
        offsets, before, previous = stable(), self._previous_plan, self.previous
        earlier = None if before is None else PlannedLog.of(before)
        if before is not None and previous is not None and earlier is not None and earlier.is_log(current):
            ends = carried_ends(before, partitions, previous.plan_of, previous.checkpoints.first_batch)
            went_back = any(offsets[p] < end for p, end in ends.items() if p in offsets)
            log.info(f"{self.checkpoints.source_id}: the epoch goes on where the one before ended on {topic!r} "
                     + ("(the log went back: a new generation)" if went_back else ""))
            return Position({p: min(ends.get(p, 0), offsets[p]) for p in partitions},
                             PlannedLog.now(current, earlier.generation + went_back), earliest, offsets, first=True)
        if before is not None:
            what = "another log" if earlier else "a log it did not record"
            log.warning(f"{self.checkpoints.source_id}: the epoch before read {what}; this epoch reads {topic!r} "
                        f"from starting_offsets={self.source.starting_offsets!r}")
        starts = earliest if self.source.starting_offsets == "earliest" else offsets
        return Position(dict(starts), PlannedLog.now(current), earliest, offsets, first=True)


def within(proposal: BatchPlan | None, fresh: BatchPlan) -> bool:
    """Whether the plan read ahead, `proposal`, may be recorded instead of `fresh`: the same batch, horizon floor
    and lost ranges, each partition's offsets starting where `fresh`'s do and ending no later. The records at an
    offset never change, so it is a smaller batch of the same records (the rest comes next); more arrived since
    it was proposed is the common case of a topic that is not behind."""
    if proposal is None or proposal.kind != "kafka":
        return False
    same = ((proposal.batch_id, proposal.horizon_floor_ms, proposal.lost)
            == (fresh.batch_id, fresh.horizon_floor_ms, fresh.lost))
    starts = [(p, start) for p, start, _ in proposal.offsets] == [(p, start) for p, start, _ in fresh.offsets]
    return same and starts and all(
        start <= until <= limit for (_, start, until), (_, _, limit) in zip(proposal.offsets, fresh.offsets, strict=True)
    )


def shared(budget: int, available: dict[int, int]) -> dict[int, int]:
    """`budget` records shared out evenly over the partitions, a partition with fewer waiting leaving its part of
    the share to the others."""
    taken, order = {}, sorted(available, key=available.__getitem__)
    for index, partition in enumerate(order):
        taken[partition] = min(available[partition], -(-budget // (len(order) - index)))
        budget -= taken[partition]
    return taken
