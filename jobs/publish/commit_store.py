"""The commit store: commit sequences and their progress, durable beside the lake (Gobblin's CommitStepStore).

A commit sequence is the ordered list of side effects that publish one result (rename files into place, load
BigQuery, record a high watermark). It is written once, *before* any step runs (write-ahead); whoever finds it
unfinished later verifies and redoes its steps until every one verifies. This module only stores sequences and
their progress (the documents it keeps are in `onceflow.jobs.publish.commit_records`); what a step is and how it
runs belongs to `onceflow.jobs.publish.sequence`.

Layout in the `ObjectStore` (local disk or `gs://`, see `LakeResource.commits()`):

```
sequences/<id>.json          the sequence: its ordered step specs; created once, never changed
state/<id>/<revision>.json   its progress (`SequenceState`); every change is a new revision, created only if absent
done/<id>.json               written once when the sequence finished: lets `unfinished()` skip finished ones cheaply
published/<asset>/<ms>.json  high-watermark markers of an asset: its published-through value is the largest
```

Every change of a sequence's state is a compare-and-swap: the writer reads the newest revision `r` and creates
revision `r + 1` with the object store's create-if-absent (`os.link` on disk, `if_generation_match=0` on GCS); if
another writer created it first, the change is recomputed on top of that one. So two runners of one sequence, or a
runner and an operator, never lose each other's updates. Revisions are never deleted while a sequence lives (a
deleted revision number could be created again by a stale writer); a sequence accumulates a few per attempt.

A sequence id and an asset name become key parts: ids are restricted to `[A-Za-z0-9_.:=-]` (no `/`, no `..`).

Example::

    store = CommitStore(lake.commits())
    if store.write_sequence(SequenceRecord(id="event_counts:2026-11-21-10:05:pane-1", steps=steps)):
        ...  # this writer's sequence stands; else an earlier one with the same id does
    number = store.start_attempt(sequence_id, run_id=run.run_id, root_run_id=run.root_run_id)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from onceflow.jobs.publish.commit_records import (
    DONE,
    FAILED,
    PENDING,
    QUARANTINED,
    Attempt,
    AttemptOutcome,
    PublishedMark,
    SequenceClosed,
    SequenceDone,
    SequenceRecord,
    SequenceState,
    asset_key_part,
    checked_sequence_id,
    now_ms,
)
from onceflow.resources.object_store import ObjectStore

_CAS_TRIES = 1000


class CommitStore:
    """Commit sequences, their progress and the published high watermarks, in one `ObjectStore`.

    Every method is safe to call from several processes at once (see the module docstring). A sequence's
    `state` is replaced only through compare-and-swap, never read-modify-written blindly.
    """

    def __init__(self, store: ObjectStore, clock: Callable[[], int] = now_ms) -> None:
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
        key = self._sequence_key(sequence_id)
        data = self.store.read(key)
        return SequenceRecord.load(data, self.store.url(key)) if data is not None else None

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
            return state.model_copy(update={"steps": tuple(steps)})

        return self._update(sequence_id, change)

    def start_attempt(self, sequence_id: str, run_id: str, root_run_id: str) -> int:
        """Record that run `run_id` starts working on the sequence, and return its attempt number.

        A run whose `root_run_id` already tried (a Dagster retry of an earlier run) continues that lineage: it
        gets the lineage's number and uses no budget. A new root starts the next lineage; if that would exceed
        `max_attempts`, the sequence is quarantined instead. Raises `SequenceClosed`, recording no attempt, if
        the sequence is (or thereby becomes) done or quarantined.
        """
        started = self.clock()
        state = self._update(sequence_id, lambda s: s.started(run_id, root_run_id, started))
        if state.status != PENDING:
            raise SequenceClosed(sequence_id, state.status, state.quarantine_reason)
        return next(a.number for a in reversed(state.attempts) if a.run_id == run_id)

    def finish_attempt(
        self, sequence_id: str, run_id: str, outcome: AttemptOutcome, error: str | None = None,
        unavailable: bool = False,
    ) -> SequenceState:
        """Record how run `run_id`'s latest attempt ended.

        `done` means every step verified: the sequence becomes done (final). `failed` records `error` as the
        attempt's and the sequence's `last_error`, and quarantines the sequence if the budget is used up (unless
        the attempt failed on a sink that could not be reached: `unavailable` gives its lineage back). A done
        sequence stays done whatever a concurrent runner reports.
        """
        finished = self.clock()

        def change(state: SequenceState) -> SequenceState:
            attempts = list(state.attempts)
            for i in range(len(attempts) - 1, -1, -1):
                if attempts[i].run_id == run_id and attempts[i].outcome is None:
                    attempts[i] = attempts[i].model_copy(update={
                        "finished_at_ms": finished, "outcome": outcome, "error": error, "unavailable": unavailable})
                    break
            else:
                raise KeyError(f"run {run_id} has no running attempt at commit sequence {sequence_id}")
            if outcome != DONE:
                return state.failed(tuple(attempts), error, finished, unavailable)
            if any(s != DONE for s in state.steps):
                raise ValueError(f"commit sequence {sequence_id} cannot be done: steps {state.steps}")
            return state.model_copy(update={"attempts": tuple(attempts), "status": DONE})

        state = self._update(sequence_id, change)
        if state.status == DONE:
            self.store.create(f"done/{sequence_id}.json", SequenceDone(at_ms=finished).to_json())
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
                attempts[open_[-1]] = attempts[open_[-1]].model_copy(
                    update={"finished_at_ms": now, "outcome": FAILED, "error": error})
            elif any(a.run_id == run_id for a in attempts):
                return state
            else:
                earlier = [a.number for a in attempts if a.root_run_id == root_run_id]
                number = earlier[0] if earlier else state.next_attempt
                attempts.append(Attempt(number=number, run_id=run_id, root_run_id=root_run_id, started_at_ms=now,
                                        finished_at_ms=now, outcome=FAILED, error=error))
            return state.failed(tuple(attempts), error, now)

        return self._update(sequence_id, change)

    def quarantine(self, sequence_id: str, reason: str) -> SequenceState:
        """Stop all attempts at a pending sequence until `rearm`. A done sequence stays done."""
        return self._update(
            sequence_id, lambda s: s.quarantined(reason, self.clock()) if s.status == PENDING else None
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
            return state.rearmed(max_attempts or state.max_attempts, self.clock())

        return self._update(sequence_id, change)

    def _state(self, record: SequenceRecord) -> SequenceState:
        for _ in range(_CAS_TRIES):
            revisions = self.store.list(self._state_prefix(record.id))
            if not revisions:
                return SequenceState(sequence_id=record.id, status=PENDING,
                                     steps=tuple(PENDING for _ in record.steps), max_attempts=record.max_attempts)
            data = self.store.read(revisions[-1])
            if data is not None:  # None only if the sequence's state was removed while listing
                state = SequenceState.load(data, self.store.url(revisions[-1]))
                revision = int(revisions[-1].rsplit("/", 1)[1].removesuffix(".json"))
                return state.model_copy(update={"revision": revision})
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
            new = changed.model_copy(update={"revision": current.revision + 1, "updated_at_ms": self.clock()})
            if self.store.create(self._state_key(sequence_id, new.revision), new.to_json()):
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
        mark = PublishedMark(through_ms=through_ms, at_ms=self.clock())
        self.store.create(f"{prefix}{through_ms:015d}.json", mark.to_json())
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

    def _state_key(self, sequence_id: str, revision: int) -> str:
        return f"{self._state_prefix(sequence_id)}{revision:010d}.json"

    @staticmethod
    def _published_prefix(asset: str) -> str:
        return f"published/{asset_key_part(asset)}/"

