"""What one micro-batch's ingest did: its counts, which must balance, and how it committed."""

from __future__ import annotations

from dataclasses import dataclass, field

from onceflow.jobs.ingest.stage_times import StageTimes


@dataclass
class IngestResult:
    """What one micro-batch did. Every landed record is one of: inserted, a duplicate (of a record earlier in the
    batch or already committed), or a dead letter (new, or a duplicate of a dead letter already held).

    For a replayed batch (`replayed`: committed by an earlier or concurrent attempt, nothing written now) the
    counts are those of the commit that did the work, read back from the Delta history: totals stay exact.
    `lost_race` says a concurrent attempt at the same batch committed first; `realigned_from` is the batch the
    checkpoint wrongly claimed as the last committed one, when the lake was ahead of it; `read_ahead` says the
    batch's read began while the batch before it committed (`onceflow.jobs.sources.read_ahead`); `counted` says this
    attempt's checkpoint update is the one that recorded the batch committed (its figures count, once; another
    attempt that committed or recorded it counts them); `times` says
    where its time went, by stage (`onceflow.jobs.ingest.stage_times`).
    """

    batch_id: int
    landed: int = 0
    received: int = 0
    inserted: int = 0
    duplicates_in_batch: int = 0
    duplicates_committed: int = 0
    dead_lettered: dict[str, int] = field(default_factory=dict)
    dead_lettered_new: int = 0
    replayed: bool = False
    lost_race: bool = False
    realigned_from: int | None = None
    read_ahead: bool = False
    fast_path: dict[str, int | bool] | None = None
    raw_version: int | None = None
    min_event_time_ms: int | None = None
    max_event_time_ms: int | None = None
    stream_max_event_ms: dict[int, int] = field(default_factory=dict)
    counted: bool = True
    times: StageTimes = field(default_factory=StageTimes)

    @property
    def duplicates(self) -> int:
        return self.duplicates_in_batch + self.duplicates_committed + self.dead_letter_duplicates

    @property
    def dead_lettered_total(self) -> int:
        return sum(self.dead_lettered.values())

    @property
    def dead_letter_duplicates(self) -> int:
        return self.dead_lettered_total - self.dead_lettered_new

    def balances(self) -> bool:
        """The landing's record count equals what classification saw, and what the commits wrote plus the
        duplicates accounts for every record, with no count negative."""
        counts = (self.inserted, self.duplicates_in_batch, self.duplicates_committed, self.dead_lettered_new,
                  self.dead_letter_duplicates)
        return (
            self.landed == self.received
            and self.received == self.inserted + self.duplicates + self.dead_lettered_new
            and min(counts) >= 0
        )
