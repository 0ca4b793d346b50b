"""Commit steps and sequences: side effects that leave the platform exactly once (Gobblin's CommitStepStore).

A `CommitSequence` is the ordered list of `CommitStep`s that publish one result. It is written to the
`CommitStore` before any step runs; `run_sequence` then takes each step not yet recorded as done and

1. calls `verify()`: if the step's effect is already in place (an earlier attempt got that far and died before
   recording it), the step is recorded as done without touching anything;
2. otherwise calls `execute()`, which brings the effect about from whatever an earlier partial attempt left,
   then `verify()` again, which must now succeed, and records the step as done.

Every step is idempotent (executing it again, or concurrently with another runner, has the effect of executing it
once) and its `verify()` is read-only. So a sequence left unfinished by a crashed or failed run is finished by
simply running it again, any number of times, from anywhere. Attempts are counted per sequence; when the budget
is used up the sequence is quarantined until an operator re-arms it (`CommitStore.rearm`).

Steps:

- `FileFinalize`: move a temp file to its deterministic final name in the file sink.
- `BigQueryLoad`: replace a window's rows in a BigQuery table with one pane's rows, through deterministic job ids.
- `HighWatermark`: record how far an asset has been published.
- `RecordWrite`, `StagedDrop`: one sink of a record output holds a batch; its staged rows let go
  (`onceflow.jobs.publish.record_steps`).

Example::

    ctx = CommitContext(CommitStore(lake.commits()), bigquery=lambda project: bigquery_resource.get_client())
    for sequence_id in ctx.store.unfinished():
        result = run_sequence(ctx, sequence_id, run_id=run.run_id, root_run_id=run.root_run_id)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from onceflow.jobs.publish.bigquery_load import BigQueryLoad
from onceflow.jobs.publish.commit_records import (
    DEFAULT_MAX_ATTEMPTS,
    DONE,
    FAILED,
    QUARANTINED,
    SequenceClosed,
    SequenceRecord,
    asset_key_part,
    checked_sequence_id,
)
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_steps import RecordWrite, StagedDrop
from onceflow.jobs.publish.step import CommitContext, CommitStep, sha256_hex
from onceflow.resources.faults import fault_point
from onceflow.resources.object_store import LocalStore, fsync_dir


def sequence_id(asset: str, window_key: str, pane: int) -> str:
    """The id of the sequence publishing pane `pane` of window `window_key` of `asset`, e.g.
    `event_counts:2026-11-21-10:05:pane-1`. A pure function of its arguments: publishing a pane twice finds the
    first sequence."""
    return checked_sequence_id(f"{asset_key_part(asset)}:{window_key}:pane-{pane}")


def sequence_asset(seq_id: str) -> str:
    """The asset a sequence made by `sequence_id` publishes (`event_counts`, `team/event_counts`)."""
    return checked_sequence_id(seq_id).split(":", 1)[0].replace(".", "/")




@dataclass(frozen=True)
class FileFinalize(CommitStep):
    """Move `temp_key` to `final_key` inside the file sink at `root`, which holds the bytes with `sha256`.

    Verified when the final file exists with exactly those bytes and the temp file is gone. On local disk the move
    is an `os.replace` (atomic); on object storage it is a copy then a delete, which a crash can interrupt
    between the two: then the final file is already right and executing again only deletes the temp file. The
    final name is chosen by the publisher, deterministic per window, pane and shard (see `onceflow.jobs.publish.pane_sequence`).
    """

    kind: ClassVar[str] = "file_finalize"
    root: str
    temp_key: str
    final_key: str
    sha256: str

    def describe(self) -> str:
        return f"{self.kind} {self.root}/{self.final_key}"

    def verify(self, ctx: CommitContext) -> bool:
        sink = ctx.sink(self.root)
        final = sink.read(self.final_key)
        return final is not None and sha256_hex(final) == self.sha256 and not sink.exists(self.temp_key)

    def execute(self, ctx: CommitContext) -> None:
        sink = ctx.sink(self.root)
        final = sink.read(self.final_key)
        if final is not None and sha256_hex(final) == self.sha256:
            sink.delete(self.temp_key)
            return
        data = sink.read(self.temp_key)
        if data is None:
            final = sink.read(self.final_key)  # a concurrent runner may have moved it since the first look
            if final is not None and sha256_hex(final) == self.sha256:
                return
            raise FileNotFoundError(
                f"neither the temp file {sink.url(self.temp_key)} nor a final file {sink.url(self.final_key)} "
                "with the expected bytes exists"
            )
        if sha256_hex(data) != self.sha256:
            raise ValueError(f"temp file {sink.url(self.temp_key)} does not hold the bytes the sequence expects")
        if isinstance(sink, LocalStore):
            # A concurrent runner may win the rename: verify() then finds its result.
            with suppress(FileNotFoundError):
                os.replace(sink.url(self.temp_key), sink.url(self.final_key))
            fsync_dir(Path(os.path.dirname(sink.url(self.final_key))))
        else:
            sink.write(self.final_key, data)
            sink.delete(self.temp_key)




@dataclass(frozen=True)
class HighWatermark(CommitStep):
    """Record that `asset` is published through `published_through_ms` (the end of the newest published window).

    Kept in the commit store (`CommitStore.record_published`); the stored value only ever grows, so executing
    this after a later window was recorded changes nothing. Verified when the stored value is at least this one.
    """

    kind: ClassVar[str] = "high_watermark"
    asset: str
    published_through_ms: int

    def describe(self) -> str:
        return f"{self.kind} {self.asset} through {self.published_through_ms}"

    def verify(self, ctx: CommitContext) -> bool:
        stored = ctx.store.published_through(self.asset)
        return stored is not None and stored >= self.published_through_ms

    def execute(self, ctx: CommitContext) -> None:
        ctx.store.record_published(self.asset, self.published_through_ms)


STEP_KINDS: dict[str, type[CommitStep]] = {
    k.kind: k for k in (FileFinalize, BigQueryLoad, HighWatermark, RecordWrite, StagedDrop)
}
"""Every step kind a stored sequence may name."""


def step_from_dict(data: Mapping[str, Any]) -> CommitStep:
    """The step `data` describes (see `CommitStep.to_dict`); raises `ValueError` for an unknown kind."""
    params = dict(data)
    kind = params.pop("kind")
    if kind not in STEP_KINDS:
        raise ValueError(f"unknown commit step kind {kind!r} (known: {sorted(STEP_KINDS)})")
    return STEP_KINDS[kind].from_params(params)


@dataclass(frozen=True)
class CommitSequence:
    """An ordered list of steps with a deterministic id; see the module docstring for how it is run."""

    id: str
    steps: tuple[CommitStep, ...]
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def to_record(self) -> SequenceRecord:
        return SequenceRecord(id=self.id, steps=tuple(s.to_dict() for s in self.steps), max_attempts=self.max_attempts)

    @classmethod
    def from_record(cls, record: SequenceRecord) -> CommitSequence:
        return cls(record.id, tuple(step_from_dict(s) for s in record.steps), record.max_attempts)

    def write(self, store: CommitStore) -> tuple[CommitSequence, bool]:
        """Write the sequence ahead of any step. Returns the sequence that stands and whether it is this one
        (False: a sequence with this id was written before, and that one stands)."""
        if store.write_sequence(self.to_record()):
            return self, True
        existing = store.get(self.id)
        assert existing is not None  # sequences are never deleted while anyone may still write them
        return CommitSequence.from_record(existing), False


Outcome = Literal["done", "already_done", "failed", "quarantined"]


class CommitFailed(RuntimeError):
    """A run's attempt at a commit sequence failed (see `CommitResult.raise_on_failure`)."""


@dataclass(frozen=True)
class CommitResult:
    """What one `run_sequence` call did.

    `outcome`: `done` (this call finished the sequence), `already_done` (nothing to do), `failed` (this attempt
    failed; the sequence stays pending for a later attempt) or `quarantined` (this attempt failed and used up the
    budget, or the sequence was quarantined already and nothing ran). `attempt` is the attempt number (None if
    no attempt was recorded); `executed` lists the steps this call executed, `verified` those it found already
    in effect; `error` is this attempt's error.
    """

    sequence_id: str
    outcome: Outcome
    attempt: int | None
    executed: tuple[int, ...] = ()
    verified: tuple[int, ...] = ()
    error: str | None = None

    def raise_on_failure(self) -> None:
        """Raise `CommitFailed` if this call's attempt failed: what makes a Dagster run fail (and be retried)."""
        if self.error is not None:
            raise CommitFailed(f"commit sequence {self.sequence_id} attempt {self.attempt}: {self.error}")


def run_sequence(ctx: CommitContext, sequence_id: str, run_id: str, root_run_id: str | None = None) -> CommitResult:
    """Drive sequence `sequence_id` to the end, as run `run_id` of the Dagster run lineage `root_run_id`.

    Records an attempt (a retry of a run, same `root_run_id`, continues its lineage's attempt), then for each
    step not yet recorded done: verify, or execute + crash point `commit.after_step` + verify, and record it
    done. A step error or a step that does not verify after executing fails the attempt: the error is recorded
    and, when the budget is used up, the sequence is quarantined (a `ConnectionError`, `onceflow.Sink`'s `SinkUnavailable` among them, uses no budget). Safe to run concurrently with itself. Raises
    `KeyError` if there is no such sequence; errors of the commit store itself propagate (the attempt then stays
    without outcome, as if the process had died).
    """
    record = ctx.store.get(sequence_id)
    if record is None:
        raise KeyError(f"no commit sequence {sequence_id!r}")
    sequence = CommitSequence.from_record(record)
    try:
        attempt = ctx.store.start_attempt(sequence_id, run_id, root_run_id or run_id)
    except SequenceClosed as closed:
        return CommitResult(sequence_id, "already_done" if closed.status == DONE else QUARANTINED, None)

    executed: list[int] = []
    verified: list[int] = []
    statuses = ctx.store.state(sequence_id).steps
    for index, step in enumerate(sequence.steps):
        if statuses[index] == DONE:
            continue
        try:
            if step.verify(ctx):
                verified.append(index)
            else:
                step.execute(ctx)
                fault_point("commit.after_step")
                if not step.verify(ctx):
                    raise RuntimeError("executed, but its effect does not verify")
                executed.append(index)
        except Exception as error:
            message = f"step {index} ({step.describe()}): {type(error).__name__}: {error}"[:4000]
            state = ctx.store.finish_attempt(sequence_id, run_id, FAILED, message, isinstance(error, ConnectionError))
            outcome: Outcome = QUARANTINED if state.status == QUARANTINED else FAILED
            return CommitResult(sequence_id, outcome, attempt, tuple(executed), tuple(verified), message)
        ctx.store.mark_step_done(sequence_id, index)
    ctx.store.finish_attempt(sequence_id, run_id, DONE)
    return CommitResult(sequence_id, DONE, attempt, tuple(executed), tuple(verified))
