"""The commit store on local disk: write-once sequences, compare-and-swap state, attempt budget, high watermarks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.jobs.publish.commit_records import (
    DONE,
    FAILED,
    PENDING,
    QUARANTINED,
    SequenceClosed,
    SequenceRecord,
)
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.resources.object_store import LocalStore

SEQ = "event_counts:2026-11-21-10:05:pane-1"
STEPS = ({"kind": "a", "x": 1}, {"kind": "b"}, {"kind": "c", "y": [1, 2]})


@pytest.fixture
def store(tmp_path: Path) -> CommitStore:
    return CommitStore(LocalStore(tmp_path / "commits"))


def record(max_attempts: int = 5, seq: str = SEQ, steps: tuple[dict, ...] = STEPS) -> SequenceRecord:
    return SequenceRecord(id=seq, steps=steps, max_attempts=max_attempts, created_at_ms=1)


def all_at_once(count: int, work: Callable[[int], None]) -> None:
    """Run `work(0..count-1)` in threads released together; re-raise the first error."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_a_sequence_is_written_once_and_the_first_stands(store: CommitStore, tmp_path: Path) -> None:
    assert store.write_sequence(record())
    assert not store.write_sequence(record(steps=({"kind": "other"},)))

    assert store.get(SEQ) == record()
    assert store.get("event_counts:2026-11-21-10:06:pane-1") is None
    assert store.sequences() == [SEQ]
    # Durable: a new store over the same directory reads the same sequence.
    assert CommitStore(LocalStore(tmp_path / "commits")).get(SEQ) == record()


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "a..b", "a b", "/abs"])
def test_ids_that_could_escape_or_nest_are_refused(store: CommitStore, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid commit sequence id"):
        SequenceRecord(id=bad, steps=STEPS)
    with pytest.raises(ValueError, match="invalid commit sequence id"):
        store.get(bad)


def test_records_need_steps_with_kinds_and_a_positive_budget() -> None:
    with pytest.raises(ValueError, match="no steps"):
        SequenceRecord(id=SEQ, steps=())
    with pytest.raises(ValueError, match="has no 'kind'"):
        SequenceRecord(id=SEQ, steps=({"x": 1},))
    with pytest.raises(ValueError, match="max_attempts"):
        SequenceRecord(id=SEQ, steps=STEPS, max_attempts=0)


def test_initial_state_and_step_marks(store: CommitStore) -> None:
    with pytest.raises(KeyError):
        store.state(SEQ)
    store.write_sequence(record())

    initial = store.state(SEQ)
    assert (initial.status, initial.steps, initial.attempts, initial.revision) == (PENDING, (PENDING,) * 3, (), 0)
    assert store.unfinished() == [SEQ]

    assert store.mark_step_done(SEQ, 1).steps == (PENDING, DONE, PENDING)
    assert store.mark_step_done(SEQ, 1).revision == 1  # idempotent: no new revision
    assert store.state(SEQ).steps == (PENDING, DONE, PENDING)
    with pytest.raises(IndexError):
        store.mark_step_done(SEQ, 3)


def test_a_dagster_retry_continues_its_lineage_and_uses_no_budget(store: CommitStore) -> None:
    store.write_sequence(record(max_attempts=2))

    assert store.start_attempt(SEQ, "run-1", root_run_id="root-A") == 1
    store.finish_attempt(SEQ, "run-1", FAILED, "boom 1")
    # Dagster retries run-1 twice: new run ids, same root.
    assert store.start_attempt(SEQ, "run-2", root_run_id="root-A") == 1
    store.finish_attempt(SEQ, "run-2", FAILED, "boom 2")
    assert store.start_attempt(SEQ, "run-3", root_run_id="root-A") == 1
    state = store.finish_attempt(SEQ, "run-3", FAILED, "boom 3")

    assert [(a.number, a.run_id, a.root_run_id, a.outcome, a.error) for a in state.attempts] == [
        (1, "run-1", "root-A", FAILED, "boom 1"),
        (1, "run-2", "root-A", FAILED, "boom 2"),
        (1, "run-3", "root-A", FAILED, "boom 3"),
    ]
    assert (state.status, state.attempts_used, state.next_attempt, state.last_error) == (PENDING, 1, 2, "boom 3")

    # A new root is the second (and last allowed) lineage; its failure quarantines.
    assert store.start_attempt(SEQ, "run-4", root_run_id="root-B") == 2
    state = store.finish_attempt(SEQ, "run-4", FAILED, "boom 4")
    assert (state.status, state.attempts_used) == (QUARANTINED, 2)
    assert state.quarantine_reason == "2 of 2 attempts failed; last error: boom 4"


def test_quarantine_after_max_attempts_and_rearm(store: CommitStore) -> None:
    store.write_sequence(record(max_attempts=3))
    for n in (1, 2, 3):
        assert store.start_attempt(SEQ, f"run-{n}", f"run-{n}") == n
        store.finish_attempt(SEQ, f"run-{n}", FAILED, f"error {n}")

    assert store.state(SEQ).status == QUARANTINED
    assert store.unfinished() == []
    assert store.quarantined() == [SEQ]
    with pytest.raises(SequenceClosed) as closed:
        store.start_attempt(SEQ, "run-4", "run-4")
    assert closed.value.status == QUARANTINED
    assert len(store.state(SEQ).attempts) == 3  # the refused start recorded nothing

    state = store.rearm(SEQ)
    assert (state.status, state.attempts_used, state.next_attempt, state.quarantine_reason) == (PENDING, 0, 4, None)
    assert [e.event for e in state.history] == [QUARANTINED, "rearmed"]
    assert store.unfinished() == [SEQ]
    assert store.quarantined() == []
    # History stays and numbers keep counting, so `<sequence>:attempt:<k>` never repeats.
    assert store.start_attempt(SEQ, "run-5", "run-5") == 4
    store.mark_step_done(SEQ, 0)
    store.mark_step_done(SEQ, 1)
    store.mark_step_done(SEQ, 2)
    state = store.finish_attempt(SEQ, "run-5", DONE)
    assert state.status == DONE
    assert [a.number for a in state.attempts] == [1, 2, 3, 4]
    assert store.unfinished() == []
    assert store.quarantined() == []
    with pytest.raises(ValueError, match="is done"):
        store.rearm(SEQ)


def test_lineages_that_died_count_against_the_budget(store: CommitStore) -> None:
    store.write_sequence(record(max_attempts=2))
    store.start_attempt(SEQ, "run-1", "run-1")  # these processes die: no finish_attempt
    store.start_attempt(SEQ, "run-2", "run-2")

    with pytest.raises(SequenceClosed):
        store.start_attempt(SEQ, "run-3", "run-3")
    state = store.state(SEQ)
    assert state.status == QUARANTINED
    assert state.quarantine_reason == "2 of 2 attempts used; last error: none recorded (the runs died)"
    assert [(a.run_id, a.outcome) for a in state.attempts] == [("run-1", None), ("run-2", None)]


def test_done_is_final_and_unfinished_steps_cannot_finish(store: CommitStore) -> None:
    store.write_sequence(record())
    store.start_attempt(SEQ, "run-1", "run-1")
    store.start_attempt(SEQ, "run-2", "run-2")
    with pytest.raises(ValueError, match="cannot be done"):
        store.finish_attempt(SEQ, "run-1", DONE)
    for step in range(3):
        store.mark_step_done(SEQ, step)

    assert store.finish_attempt(SEQ, "run-1", DONE).status == DONE
    # A concurrent runner that failed late does not undo it, and nothing restarts it.
    assert store.finish_attempt(SEQ, "run-2", FAILED, "late failure").status == DONE
    assert store.quarantine(SEQ, "operator").status == DONE
    with pytest.raises(SequenceClosed) as closed:
        store.start_attempt(SEQ, "run-3", "run-3")
    assert closed.value.status == DONE
    assert store.unfinished() == []
    assert (Path(store.store.url(f"done/{SEQ}.json"))).is_file()


def test_operator_quarantine_stops_a_pending_sequence(store: CommitStore) -> None:
    store.write_sequence(record())
    state = store.quarantine(SEQ, "bad data, investigating")
    assert (state.status, state.quarantine_reason) == (QUARANTINED, "bad data, investigating")
    assert store.rearm(SEQ, max_attempts=7).max_attempts == 7


def test_concurrent_updates_are_never_lost(store: CommitStore) -> None:
    steps = tuple({"kind": "s"} for _ in range(8))
    store.write_sequence(record(max_attempts=100, steps=steps))

    def work(i: int) -> None:
        store.start_attempt(SEQ, f"run-{i}", f"root-{i}")
        store.mark_step_done(SEQ, i)
        store.finish_attempt(SEQ, f"run-{i}", FAILED, f"error {i}")

    all_at_once(8, work)

    state = store.state(SEQ)
    assert state.steps == (DONE,) * 8
    assert sorted(a.run_id for a in state.attempts) == [f"run-{i}" for i in range(8)]
    assert sorted(a.number for a in state.attempts) == list(range(1, 9))
    assert all(a.outcome == FAILED for a in state.attempts)
    assert state.revision == 24  # every one of the 3 x 8 changes is its own revision


def test_high_watermark_only_grows_whatever_the_order(store: CommitStore) -> None:
    assert store.published_through("event_counts") is None
    store.record_published("event_counts", 2_000)
    store.record_published("event_counts", 1_000)
    assert store.published_through("event_counts") == 2_000

    values = [5_000 + 1_000 * i for i in range(10)]
    all_at_once(10, lambda i: store.record_published("event_counts", values[i]))

    assert store.published_through("event_counts") == 14_000
    assert store.store.list("published/event_counts/") == ["published/event_counts/000000000014000.json"]
    assert store.published_through("other_asset") is None
    store.record_published("team/event_counts", 7)
    assert store.published_through("team/event_counts") == 7
    assert store.published_through("event_counts") == 14_000
