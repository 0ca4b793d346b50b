"""The reconciliation's column-wise counting (`onceflow.jobs.verify.id_accounting`) against the same rules counted
record by record in plain Python, on hand-made cases and on a random workload with every kind of ID."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

from onceflow.jobs.sources.landed_ids import LANDED
from onceflow.jobs.verify.id_accounting import (
    UNASSIGNED,
    later_occurrences,
    missing,
    per_window,
    repeated,
    window_key,
)
from onceflow.jobs.windows.panes import Window

WINDOW_S = 60


def landed(records: list[tuple[int, str, int | None]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(LANDED.names, r, strict=True)) for r in records], schema=LANDED)


def key(event_ms: int | None) -> str:
    return UNASSIGNED if event_ms is None else Window.at(event_ms, WINDOW_S).key


def duplicates_one_by_one(records: list[tuple[int, str, int | None]], raw: list[str] | None,
                          dead: list[str]) -> Counter:
    """The rule, record by record: an ID is kept once among valid rows (unless all are kept) and once among dead
    letters; every later occurrence of a kept ID is a duplicate, in the window of that occurrence."""
    keeps = Counter({i: 1 for i in raw} if raw is not None else {})
    keeps.update({i: 1 for i in dead})
    seen, duplicates = Counter(), Counter()
    for _, record_id, event_ms in records:
        seen[record_id] += 1
        if record_id in keeps and seen[record_id] > keeps[record_id]:
            duplicates[key(event_ms)] += 1
    return duplicates


def test_duplicates_are_the_occurrences_after_those_the_tables_keep() -> None:
    minute = 60_000
    records = [
        (1, "a", 0), (1, "b", 10), (1, "a", minute),       # a: valid, sent twice
        (2, "c", None), (2, "c", 5), (2, "c", minute + 1),  # c: bad first, then right, then again
        (3, "lost", 7), (3, "lost", 8),                      # held nowhere: no duplicates to count
        (3, "early", -1), (3, "early", -minute - 1),         # before 1970: floored, not truncated
    ]
    raw, dead = ["a", "b", "c", "early"], ["c"]
    table = landed(records)
    later = later_occurrences(table, pa.array(raw), pa.array(dead))
    assert later.column("record_id").to_pylist() == ["a", "c", "early"]
    assert per_window(later.column("event_time_ms"), WINDOW_S) == duplicates_one_by_one(records, raw, dead) == Counter(
        {key(minute): 2, key(-minute - 1): 1})
    assert key(-minute - 1) == "1969-12-31-23:58"
    # At least once: every valid occurrence is a row, only a dead letter's repeats are duplicates.
    kept_all = later_occurrences(table, None, pa.array(dead))
    assert kept_all.column("record_id").to_pylist() == ["c", "c"]
    assert missing(table.column("record_id"), pa.array(raw), pa.array(dead)) == ["lost"]


def test_windows_and_repeats_are_counted_exactly() -> None:
    times = pa.array([0, 59_999, 60_000, None, -1, None], pa.int64())
    assert per_window(times, WINDOW_S) == Counter({key(0): 2, key(60_000): 1, UNASSIGNED: 2, key(-1): 1})
    batches = pa.array([1, 2, 2, 1, 1, 1], pa.int64())
    assert per_window(times, WINDOW_S, batches) == Counter(
        {(key(0), 1): 1, (key(0), 2): 1, (key(60_000), 2): 1, (UNASSIGNED, 1): 2, (key(-1), 1): 1})
    assert window_key(None, WINDOW_S) == UNASSIGNED
    assert repeated(pa.chunked_array([["x", "y"], ["x", "z", "x", "y"]], pa.string_view())) == ["x", "y"]
    assert repeated(pa.chunked_array([], pa.string())) == []
    assert missing(pa.array([], pa.large_string()), pa.array([], pa.string())) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_random_workload_counts_as_record_by_record(seed: int) -> None:
    rng = random.Random(seed)
    pool = [f"id-{n}" for n in range(400)]
    records = [(b, rng.choice(pool), rng.choice([None, rng.randrange(-10**9, 10**12)]))
               for b in range(1, 11) for _ in range(300)]
    landed_ids = {r[1] for r in records}
    raw = [i for i in landed_ids if rng.random() < 0.8]
    dead = [i for i in landed_ids if rng.random() < 0.1]
    table = landed(records)
    for kept_raw in (raw, None):
        later = later_occurrences(table, None if kept_raw is None else pa.array(kept_raw), pa.array(dead))
        assert per_window(later.column("event_time_ms"), WINDOW_S) == duplicates_one_by_one(records, kept_raw, dead)
    assert per_window(table.column("event_time_ms"), WINDOW_S) == Counter(key(t) for _, _, t in records)
    assert missing(table.column("record_id"), pa.array(raw), pa.array(dead)) == sorted(
        landed_ids - set(raw) - set(dead))
