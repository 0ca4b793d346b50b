"""The commit store: commit sequences and their progress, durable beside the lake (Gobblin's CommitStepStore).

A commit sequence is the ordered list of side effects that publish one result (rename files into place, load
BigQuery, record a high watermark). It is written once, *before* any step runs (write-ahead); whoever finds it
unfinished later verifies and redoes its steps until every one verifies. This module only stores sequences and
their progress; what a step is and how it runs belongs to `onceflow.jobs.publish.sequence` (resources know nothing of jobs).

Layout in the `ObjectStore` (local disk or `gs://`, see `LakeResource.commits()`):

```
sequences/<id>.json          the sequence: its ordered step specs; created once, never changed
state/<id>/<version>.json    its progress (`SequenceState`); every change is a new version, created only if absent
done/<id>.json               written once when the sequence finished: lets `unfinished()` skip finished ones cheaply
published/<asset>/<ms>.json  high-watermark markers of an asset: its published-through value is the largest
```

Every change of a sequence's state is a compare-and-swap: the writer reads the newest version `v` and creates
version `v + 1` with the object store's create-if-absent (`os.link` on disk, `if_generation_match=0` on GCS); if
another writer created it first, the change is recomputed on top of that one. So two runners of one sequence, or a
runner and an operator, never lose each other's updates. Versions are never deleted while a sequence lives (a
deleted version number could be created again by a stale writer); a sequence accumulates a few per attempt.

A sequence id and an asset name become key parts: ids are restricted to `[A-Za-z0-9_.:=-]` (no `/`, no `..`).

Example::

    store = CommitStore(lake.commits())
    if store.write_sequence(SequenceRecord("event_counts:2026-11-21-10:05:pane-1", steps)):
        ...  # this writer's sequence stands; else an earlier one with the same id does
    number = store.start_attempt(sequence_id, run_id=run.run_id, root_run_id=run.root_run_id)
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from onceflow.resources.object_store import ObjectStore

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
_CAS_TRIES = 1000


def _now_ms() -> int:
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


@dataclass(frozen=True)
class SequenceRecord:
    """A commit sequence as stored: its id and ordered step specs, each a JSON object with a `kind`.

    `max_attempts` is the budget of attempt lineages before the sequence is quarantined (see `SequenceState`).
    The record is immutable once written: a sequence's steps are fixed before the first of them runs.
    """

    id: str
    steps: tuple[Mapping[str, Any], ...]
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    created_at_ms: int = field(default_factory=_now_ms)

    def __post_init__(self) -> None:
        checked_sequence_id(self.id)
        if not self.steps:
            raise ValueError(f"commit sequence {self.id} has no steps")
        for index, step in enumerate(self.steps):
            if not isinstance(step.get("kind"), str):
                raise ValueError(f"step {index} of commit sequence {self.id} has no 'kind': {step!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def to_json(self) -> bytes:
        return json.dumps(
            {"id": self.id, "steps": [dict(s) for s in self.steps], "max_attempts": self.max_attempts,
             "created_at_ms": self.created_at_ms},
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SequenceRecord:
        raw = json.loads(data)
        return cls(raw["id"], tuple(raw["steps"]), raw["max_attempts"], raw["created_at_ms"])


@dataclass(frozen=True)
class Attempt:
    """One run's try at a sequence.

    `number` is the attempt lineage: runs with the same Dagster `root_run_id` (a run and its automatic retries)
    share one number; a run with a new root gets the next number. Numbers count up over the sequence's whole life,
    re-arms included, so `<sequence>:attempt:<number>` never repeats. `outcome` is None while the run is going on,
    and stays None when the process died in it.
    """

    number: int
    run_id: str
    root_run_id: str
    started_at_ms: int
    finished_at_ms: int | None = None
    outcome: AttemptOutcome | None = None
    error: str | None = None


@dataclass(frozen=True)
class StateEvent:
    """An operator-visible change of status: `quarantined` (with the reason) or `rearmed`."""

    at_ms: int
    event: str
    detail: str | None = None


@dataclass(frozen=True)
class SequenceState:
    """The progress of one sequence, as of `version` (0: nothing recorded yet).

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
    version: int = 0

    @property
    def lineages(self) -> int:
        """How many attempt lineages (distinct root runs) ever started."""
        return max((a.number for a in self.attempts), default=0)

    @property
    def attempts_used(self) -> int:
        """Attempt lineages started since the last re-arm: what counts against `max_attempts`."""
        return self.lineages - self.budget_from

    @property
    def next_attempt(self) -> int:
        """The number a new attempt lineage would get."""
        return self.lineages + 1

    def to_json(self) -> bytes:
        raw = asdict(self)
        del raw["version"]
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, version: int) -> SequenceState:
        raw = json.loads(data)
        raw["steps"] = tuple(raw["steps"])
        raw["attempts"] = tuple(Attempt(**a) for a in raw["attempts"])
        raw["history"] = tuple(StateEvent(**e) for e in raw["history"])
        return cls(**raw, version=version)


class CommitStore:
    """Commit sequences, their progress and the published high watermarks, in one `ObjectStore`.

    Every method is safe to call from several processes at once (see the module docstring). A sequence's
    `state` is replaced only through compare-and-swap, never read-modify-written blindly.
    """

    def __init__(self, store: ObjectStore, clock: Callable[[], int] = _now_ms) -> None:
        self.store = store
        self.clock = clock

    # --- sequences --------------------------------------------------------------------------------------------

    def write_sequence(self, record: SequenceRecord) -> bool:
        """Write a sequence once, before any of its steps runs.

        Returns False, writing nothing, if a sequence with this id exists already: then the existing one stands,
        and the caller must use it (`get`) instead of its own.
        """
        return self.store.create(self._sequence_key(record.id), record.to_json())

    def get(self, sequence_id: str) -> SequenceRecord | None:
        """The sequence `sequence_id`, or None if it was never written."""
        data = self.store.read(self._sequence_key(sequence_id))
        return SequenceRecord.from_json(data) if data is not None else None

    def sequences(self) -> list[str]:
        """Ids of all stored sequences, sorted."""
        return [k.removeprefix("sequences/").removesuffix(".json") for k in self.store.list("sequences/")]

    def unfinished(self) -> list[str]:
        """Ids of sequences that are neither done nor quarantined, sorted: what a commit sensor should drive."""
        return [i for i in self._not_done() if self.state(i).status == PENDING]

    def quarantined(self) -> list[str]:
        """Ids of quarantined sequences, sorted: they wait for an operator's `rearm`."""
        return [i for i in self._not_done() if self.state(i).status == QUARANTINED]

    def _not_done(self) -> list[str]:
        done = {k.removeprefix("done/").removesuffix(".json") for k in self.store.list("done/")}
        return [i for i in self.sequences() if i not in done]

    # --- state ------------------------------------------------------------------------------------------------

    def state(self, sequence_id: str) -> SequenceState:
        """The newest state of `sequence_id`; raises `KeyError` if there is no such sequence."""
        record = self.get(sequence_id)
        if record is None:
            raise KeyError(f"no commit sequence {sequence_id!r}")
        return self._state(record)

    def mark_step_done(self, sequence_id: str, step_index: int) -> SequenceState:
        """Record that step `step_index` verified. Idempotent."""

        def change(state: SequenceState) -> SequenceState | None:
            if not 0 <= step_index < len(state.steps):
                raise IndexError(f"commit sequence {sequence_id} has no step {step_index}")
            if state.steps[step_index] == DONE:
                return None
            steps = list(state.steps)
            steps[step_index] = DONE
            return replace(state, steps=tuple(steps))

        return self._update(sequence_id, change)

    def start_attempt(self, sequence_id: str, run_id: str, root_run_id: str) -> int:
        """Record that run `run_id` starts working on the sequence, and return its attempt number.

        A run whose `root_run_id` already tried (a Dagster retry of an earlier run) continues that lineage: it
        gets the lineage's number and uses no budget. A new root starts the next lineage; if that would exceed
        `max_attempts`, the sequence is quarantined instead. Raises `SequenceClosed`, recording no attempt, if
        the sequence is (or thereby becomes) done or quarantined.
        """
        started = self.clock()

        def change(state: SequenceState) -> SequenceState:
            if state.status != PENDING:
                return state
            earlier = [a.number for a in state.attempts if a.root_run_id == root_run_id]
            if earlier:
                number = earlier[0]
            elif state.attempts_used >= state.max_attempts:
                reason = (f"{state.attempts_used} of {state.max_attempts} attempts used; "
                          f"last error: {state.last_error or 'none recorded (the runs died)'}")
                return self._quarantined(state, reason)
            else:
                number = state.next_attempt
            attempt = Attempt(number, run_id, root_run_id, started)
            return replace(state, attempts=(*state.attempts, attempt))

        state = self._update(sequence_id, change)
        if state.status != PENDING:
            raise SequenceClosed(sequence_id, state.status, state.quarantine_reason)
        return next(a.number for a in reversed(state.attempts) if a.run_id == run_id)

    def finish_attempt(
        self, sequence_id: str, run_id: str, outcome: AttemptOutcome, error: str | None = None
    ) -> SequenceState:
        """Record how run `run_id`'s latest attempt ended.

        `done` means every step verified: the sequence becomes done (final). `failed` records `error` as the
        attempt's and the sequence's `last_error`, and quarantines the sequence if the budget is used up. A done
        sequence stays done whatever a concurrent runner reports.
        """
        finished = self.clock()

        def change(state: SequenceState) -> SequenceState:
            attempts = list(state.attempts)
            for i in range(len(attempts) - 1, -1, -1):
                if attempts[i].run_id == run_id and attempts[i].outcome is None:
                    attempts[i] = replace(attempts[i], finished_at_ms=finished, outcome=outcome, error=error)
                    break
            else:
                raise KeyError(f"run {run_id} has no running attempt at commit sequence {sequence_id}")
            state = replace(state, attempts=tuple(attempts))
            if outcome == DONE:
                if any(s != DONE for s in state.steps):
                    raise ValueError(f"commit sequence {sequence_id} cannot be done: steps {state.steps}")
                return replace(state, status=DONE) if state.status != DONE else state
            state = replace(state, last_error=error)
            if state.status == PENDING and state.attempts_used >= state.max_attempts:
                reason = f"{state.attempts_used} of {state.max_attempts} attempts failed; last error: {error}"
                return self._quarantined(state, reason)
            return state

        state = self._update(sequence_id, change)
        if state.status == DONE:
            self.store.create(f"done/{sequence_id}.json", json.dumps({"at_ms": finished}).encode())
        return state

    def record_dead_run(self, sequence_id: str, run_id: str, root_run_id: str, error: str) -> SequenceState:
        """Record, on behalf of run `run_id`, that it ended without reporting: its process died mid-attempt, or
        before it could start one (then the attempt is recorded here, in its lineage). Fails the attempt like
        `finish_attempt`, quarantining when the budget is used up. Idempotent; nothing changes on a sequence that
        is not pending or for a run whose attempt has an outcome already.
        """
        now = self.clock()

        def change(state: SequenceState) -> SequenceState:
            if state.status != PENDING:
                return state
            attempts = list(state.attempts)
            open_ = [i for i, a in enumerate(attempts) if a.run_id == run_id and a.outcome is None]
            if open_:
                attempts[open_[-1]] = replace(attempts[open_[-1]], finished_at_ms=now, outcome=FAILED, error=error)
            elif any(a.run_id == run_id for a in attempts):
                return state
            else:
                earlier = [a.number for a in attempts if a.root_run_id == root_run_id]
                number = earlier[0] if earlier else state.next_attempt
                attempts.append(Attempt(number, run_id, root_run_id, now, now, FAILED, error))
            state = replace(state, attempts=tuple(attempts), last_error=error)
            if state.attempts_used >= state.max_attempts:
                reason = f"{state.attempts_used} of {state.max_attempts} attempts failed; last error: {error}"
                return self._quarantined(state, reason)
            return state

        return self._update(sequence_id, change)

    def quarantine(self, sequence_id: str, reason: str) -> SequenceState:
        """Stop all attempts at a pending sequence until `rearm`. A done sequence stays done."""
        return self._update(
            sequence_id, lambda s: self._quarantined(s, reason) if s.status == PENDING else None
        )

    def rearm(self, sequence_id: str, max_attempts: int | None = None) -> SequenceState:
        """The operator's command after fixing a cause: a fresh attempt budget, status back to pending.

        The attempt history stays (numbers keep counting up); only lineages started after this count against
        the budget, `max_attempts` optionally replacing the old budget. Raises `ValueError` on a done sequence.
        """
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")

        def change(state: SequenceState) -> SequenceState:
            if state.status == DONE:
                raise ValueError(f"commit sequence {sequence_id} is done; there is nothing to re-arm")
            event = StateEvent(self.clock(), "rearmed", f"was {state.status}")
            return replace(
                state,
                status=PENDING,
                budget_from=state.lineages,
                max_attempts=max_attempts or state.max_attempts,
                quarantine_reason=None,
                history=(*state.history, event),
            )

        return self._update(sequence_id, change)

    def _quarantined(self, state: SequenceState, reason: str) -> SequenceState:
        event = StateEvent(self.clock(), QUARANTINED, reason)
        return replace(state, status=QUARANTINED, quarantine_reason=reason, history=(*state.history, event))

    def _state(self, record: SequenceRecord) -> SequenceState:
        for _ in range(_CAS_TRIES):
            versions = self.store.list(self._state_prefix(record.id))
            if not versions:
                return SequenceState(record.id, PENDING, tuple(PENDING for _ in record.steps), record.max_attempts)
            data = self.store.read(versions[-1])
            if data is not None:  # None only if the sequence's state was removed while listing
                return SequenceState.from_json(data, int(versions[-1].rsplit("/", 1)[1].removesuffix(".json")))
        raise RuntimeError(f"could not read the state of commit sequence {record.id}")

    def _update(
        self, sequence_id: str, change: Callable[[SequenceState], SequenceState | None]
    ) -> SequenceState:
        """Apply `change` to the newest state by compare-and-swap; `change` returning None (or its input) writes
        nothing. `change` may run several times (once per lost race), so it must not have side effects."""
        record = self.get(sequence_id)
        if record is None:
            raise KeyError(f"no commit sequence {sequence_id!r}")
        for _ in range(_CAS_TRIES):
            current = self._state(record)
            changed = change(current)
            if changed is None or changed == current:
                return current
            new = replace(changed, version=current.version + 1, updated_at_ms=self.clock())
            if self.store.create(self._state_key(sequence_id, new.version), new.to_json()):
                return new
            time.sleep(random.uniform(0, 0.005))  # lost a race: back off a little, recompute on the winner's state
        raise RuntimeError(f"gave up updating commit sequence {sequence_id} after {_CAS_TRIES} lost races")

    # --- high watermarks --------------------------------------------------------------------------------------

    def record_published(self, asset: str, through_ms: int) -> None:
        """Record that `asset` has published everything up to `through_ms` (a window end, epoch ms).

        The published-through value only grows: it is the largest value ever recorded, whatever the order or
        concurrency of calls. Each value is a write-once marker; markers below the largest one seen are deleted
        as they stop mattering (the largest marker is never deleted: deleting needs a larger one in sight).
        """
        if through_ms < 0:
            raise ValueError(f"through_ms must not be negative, got {through_ms}")
        prefix = self._published_prefix(asset)
        body = json.dumps({"through_ms": through_ms, "at_ms": self.clock()})
        self.store.create(f"{prefix}{through_ms:015d}.json", body.encode())
        markers = self.store.list(prefix)
        for key in markers[:-1]:
            self.store.delete(key)

    def published_through(self, asset: str) -> int | None:
        """The largest value recorded by `record_published` for `asset`, None if nothing was published."""
        markers = self.store.list(self._published_prefix(asset))
        return int(markers[-1].rsplit("/", 1)[1].removesuffix(".json")) if markers else None

    # --- keys -------------------------------------------------------------------------------------------------

    @staticmethod
    def _sequence_key(sequence_id: str) -> str:
        return f"sequences/{checked_sequence_id(sequence_id)}.json"

    @staticmethod
    def _state_prefix(sequence_id: str) -> str:
        return f"state/{checked_sequence_id(sequence_id)}/"

    def _state_key(self, sequence_id: str, version: int) -> str:
        return f"{self._state_prefix(sequence_id)}{version:010d}.json"

    @staticmethod
    def _published_prefix(asset: str) -> str:
        return f"published/{asset_key_part(asset)}/"

