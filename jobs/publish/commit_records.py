"""What the commit store keeps (`onceflow.jobs.publish.commit_store`): a commit sequence as written
(`SequenceRecord`), its progress (`SequenceState`, with its `Attempt`s and `StateEvent`s) and the markers of
finished sequences and published high watermarks. Each is a versioned `Stored` document (see
`onceflow.resources.stored`); a record's step specs are plain JSON objects whose meaning belongs to
`onceflow.jobs.publish.sequence`. `SequenceState` also holds the rules of a sequence's progress (attempt
lineages, the budget, quarantine and re-arm) as pure functions; the store applies them by compare-and-swap.
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from onceflow.resources.stored import Stored

PENDING: Literal["pending"] = "pending"
DONE: Literal["done"] = "done"
QUARANTINED: Literal["quarantined"] = "quarantined"
FAILED: Literal["failed"] = "failed"
SequenceStatus = Literal["pending", "done", "quarantined"]
StepStatus = Literal["pending", "done"]
AttemptOutcome = Literal["done", "failed"]

DEFAULT_MAX_ATTEMPTS = 5
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:=-]*$")
_ASSET = re.compile(r"^[a-z][a-z0-9_]*(/[a-z][a-z0-9_]*)*$")


def now_ms() -> int:
    return int(time.time() * 1000)


def checked_sequence_id(sequence_id: str) -> str:
    """Return `sequence_id` if it is usable as a key part, else raise `ValueError`."""
    if not _ID.match(sequence_id) or ".." in sequence_id or len(sequence_id) > 512:
        raise ValueError(f"invalid commit sequence id {sequence_id!r}: [A-Za-z0-9_.:=-] only, no '..'")
    return sequence_id


def asset_key_part(asset: str) -> str:
    """An asset name (`event_counts`, `team/event_counts`) as one key part: `/` becomes `.` (names have no `.`)."""
    if not _ASSET.match(asset):
        raise ValueError(f"invalid asset name {asset!r}: lowercase letters, digits, '_' and '/' separators only")
    return asset.replace("/", ".")


class SequenceClosed(Exception):
    """Raised by `CommitStore.start_attempt` when the sequence is done or quarantined: no attempt was recorded."""

    def __init__(self, sequence_id: str, status: SequenceStatus, reason: str | None) -> None:
        super().__init__(f"commit sequence {sequence_id} is {status}" + (f": {reason}" if reason else ""))
        self.sequence_id = sequence_id
        self.status = status
        self.reason = reason


class SequenceRecord(Stored):
    """A commit sequence as stored: its id and ordered step specs, each a JSON object with a `kind`.

    `max_attempts` is the budget of attempt lineages before the sequence is quarantined (see `SequenceState`).
    The record is immutable once written: a sequence's steps are fixed before the first of them runs.
    """

    id: str
    steps: tuple[dict[str, Any], ...]
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    created_at_ms: int = Field(default_factory=now_ms)

    @model_validator(mode="after")
    def _checked(self) -> SequenceRecord:
        checked_sequence_id(self.id)
        if not self.steps:
            raise ValueError(f"commit sequence {self.id} has no steps")
        for index, step in enumerate(self.steps):
            if not isinstance(step.get("kind"), str):
                raise ValueError(f"step {index} of commit sequence {self.id} has no 'kind': {step!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        return self


class Attempt(BaseModel):
    """One run's try at a sequence.

    `number` is the attempt lineage: runs with the same Dagster `root_run_id` (a run and its automatic retries)
    share one number; a run with a new root gets the next number. Numbers count up over the sequence's whole life,
    re-arms included, so `<sequence>:attempt:<number>` never repeats. `outcome` is None while the run is going on,
    and stays None when the process died in it. `unavailable` says it failed on a sink that could not be reached.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int
    run_id: str
    root_run_id: str
    started_at_ms: int
    finished_at_ms: int | None = None
    outcome: AttemptOutcome | None = None
    error: str | None = None
    unavailable: bool = False  # it failed on a sink that could not be reached: its lineage was given back


class StateEvent(BaseModel):
    """An operator-visible change of status: `quarantined` (with the reason) or `rearmed`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at_ms: int
    event: str
    detail: str | None = None


class SequenceState(Stored):
    """The progress of one sequence, as of `revision` (0: nothing recorded yet).

    `status` is `pending` until every step verified (`done`, final) or the attempt budget ran out
    (`quarantined`, until an operator re-arms it). `steps[i]` is `done` once step `i` verified; a `pending`
    step may or may not have taken effect, which is what its `verify()` finds out. The budget: attempt lineages
    started since the last re-arm (`attempts_used`) may not exceed `max_attempts`; the sequence is quarantined
    when the last allowed lineage fails, or when a new lineage would exceed it (earlier ones having died).
    """

    sequence_id: str
    status: SequenceStatus
    steps: tuple[StepStatus, ...]
    max_attempts: int
    attempts: tuple[Attempt, ...] = ()
    budget_from: int = 0
    last_error: str | None = None
    quarantine_reason: str | None = None
    history: tuple[StateEvent, ...] = ()
    updated_at_ms: int | None = None
    # Which state this is: the number in its key (`state/<id>/<revision>.json`), which the compare-and-swap
    # creates; not part of the document (`version` is the document's format).
    revision: int = Field(default=0, exclude=True)

    @property
    def lineages(self) -> int:
        """How many attempt lineages (distinct root runs) ever started."""
        return max((a.number for a in self.attempts), default=0)

    @property
    def attempts_used(self) -> int:
        """Attempt lineages started since the last re-arm: what counts against `max_attempts`."""
        return self.lineages - self.budget_from

    @property
    def unavailable_streak(self) -> int:
        """How many of the latest finished attempts in a row failed on a sink that could not be reached."""
        streak = 0
        for attempt in reversed([a for a in self.attempts if a.outcome is not None]):
            if not attempt.unavailable:
                break
            streak += 1
        return streak

    @property
    def next_attempt(self) -> int:
        """The number a new attempt lineage would get."""
        return self.lineages + 1

    def started(self, run_id: str, root_run_id: str, at_ms: int) -> SequenceState:
        """This state with run `run_id`'s attempt started: in its root's lineage if that tried already, else in
        the next one, or quarantined instead when that would exceed the budget. Unchanged unless pending."""
        if self.status != PENDING:
            return self
        earlier = [a.number for a in self.attempts if a.root_run_id == root_run_id]
        if earlier:
            number = earlier[0]
        elif self.attempts_used >= self.max_attempts:
            reason = (f"{self.attempts_used} of {self.max_attempts} attempts used; "
                      f"last error: {self.last_error or 'none recorded (the runs died)'}")
            return self.quarantined(reason, at_ms)
        else:
            number = self.next_attempt
        attempt = Attempt(number=number, run_id=run_id, root_run_id=root_run_id, started_at_ms=at_ms)
        return self.model_copy(update={"attempts": (*self.attempts, attempt)})

    def quarantined(self, reason: str, at_ms: int) -> SequenceState:
        """This state quarantined for `reason`: no attempt runs until a re-arm."""
        event = StateEvent(at_ms=at_ms, event=QUARANTINED, detail=reason)
        return self.model_copy(
            update={"status": QUARANTINED, "quarantine_reason": reason, "history": (*self.history, event)})

    def failed(
        self, attempts: tuple[Attempt, ...], error: str | None, at_ms: int, unavailable: bool = False
    ) -> SequenceState:
        """This state with `attempts` (the last of them failed with `error`), quarantined if a pending sequence
        has thereby used up its budget. An attempt that failed on a sink that could not be reached
        (`unavailable`) gives its lineage back: an outage of any length never quarantines."""
        update: dict[str, Any] = {"attempts": attempts, "last_error": error}
        if unavailable:
            update["budget_from"] = min(self.budget_from + 1, self.lineages)
        state = self.model_copy(update=update)
        if state.status == PENDING and state.attempts_used >= state.max_attempts:
            reason = f"{state.attempts_used} of {state.max_attempts} attempts failed; last error: {error}"
            return state.quarantined(reason, at_ms)
        return state

    def rearmed(self, max_attempts: int, at_ms: int) -> SequenceState:
        """This state pending again with a fresh budget of `max_attempts` lineages from the next one on."""
        event = StateEvent(at_ms=at_ms, event="rearmed", detail=f"was {self.status}")
        return self.model_copy(update={"status": PENDING, "budget_from": self.lineages, "max_attempts": max_attempts,
                                       "quarantine_reason": None, "history": (*self.history, event)})


class SequenceDone(Stored):
    """The marker `done/<id>.json`: the sequence finished at `at_ms`."""

    at_ms: int


class PublishedMark(Stored):
    """A high-watermark marker `published/<asset>/<through_ms>.json` (its key holds the value that counts)."""

    through_ms: int
    at_ms: int


UNAVAILABLE_FIRST_WAIT_S = 10.0
UNAVAILABLE_MAX_WAIT_S = 120.0


def unavailable_wait_s(state: SequenceState, now_ms: int | None = None) -> float:
    """How long the next attempt waits, after attempts in a row that found a sink unreachable: doubling from
    `UNAVAILABLE_FIRST_WAIT_S` to `UNAVAILABLE_MAX_WAIT_S` (those attempts use no budget; this keeps an outage of
    minutes from becoming a run every tick)."""
    streak = state.unavailable_streak
    if not streak:
        return 0.0
    last_ms = max(a.finished_at_ms or 0 for a in state.attempts)
    wait_s = min(UNAVAILABLE_MAX_WAIT_S, UNAVAILABLE_FIRST_WAIT_S * 2 ** (streak - 1))
    return max(0.0, wait_s - ((now_ms if now_ms is not None else int(time.time() * 1000)) - last_ms) / 1000)
