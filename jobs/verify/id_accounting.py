"""The reconciliation's counting, column-wise in Arrow: which landed IDs no table holds, which IDs a table holds
twice, which landed occurrences are duplicates, and how many records fall in each window.

`verify` counts every record the source ever landed. Held as Python objects, a million IDs cost hundreds of MB;
as Arrow columns they cost their bytes, and the counting runs in Arrow's kernels. Only what is reported (a
window's count, an ID found wrong) becomes Python.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from onceflow.jobs.windows.panes import Window

UNASSIGNED = "unassigned"
"""The window of records without a usable event time."""

Column = pa.Array | pa.ChunkedArray


def ids(column: Column) -> pa.Array:
    """One contiguous column of IDs, whatever string type its reader gave (delta-rs's, or the landing's)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], pa.large_string())
    return column.cast(pa.large_string())


def missing(landed: Column, *held: Column) -> list[str]:
    """The landed IDs none of `held` holds, sorted."""
    absent = pc.unique(ids(landed))
    for column in held:  # one table at a time: no copy of them all together
        absent = absent.filter(pc.invert(pc.is_in(absent, value_set=ids(column))))
    return sorted(absent.to_pylist())


def repeated(column: Column) -> list[str]:
    """The IDs the column holds more than once, sorted."""
    counts = pc.value_counts(ids(column))
    twice = pc.greater(counts.field("counts"), 1)
    return sorted(counts.field("values").filter(twice).to_pylist())


def later_occurrences(landed: pa.Table, raw: pa.Array | None, dead: pa.Array) -> pa.Table:
    """The landed records (`record_id`, `event_time_ms`, in landing order) that are duplicates: every occurrence of
    an ID after as many as the tables keep of it. An ID is kept once among the valid records (`raw`; None when
    all valid ones are kept, at least once) and once among the dead letters (a bad record later sent right is
    both); an ID neither keeps (lost) has no duplicates to count."""
    count = landed.num_rows
    if not count:
        return landed
    order = pa.array(np.arange(count))
    table = landed.append_column("landing_order", order).sort_by(
        [("record_id", "ascending"), ("landing_order", "ascending")])
    record_ids = ids(table.column("record_id"))
    # Each occurrence's ordinal among its ID's: sorted by ID, a run of one ID starts where the ID changes.
    starts = np.ones(count, dtype=bool)
    starts[1:] = pc.not_equal(record_ids.slice(1), record_ids.slice(0, count - 1)).to_numpy(zero_copy_only=False)
    position = np.arange(count)
    ordinal = position - np.maximum.accumulate(np.where(starts, position, 0)) + 1
    keeps = pc.is_in(record_ids, value_set=ids(dead)).to_numpy(zero_copy_only=False).astype(np.int64)
    if raw is not None:
        keeps += pc.is_in(record_ids, value_set=ids(raw)).to_numpy(zero_copy_only=False)
    return table.filter(pa.array((keeps > 0) & (ordinal > keeps))).drop_columns(["landing_order"])


def window_starts(times_ms: Column, window_s: int) -> pa.Array:
    """The start (epoch ms) of the window of `window_s` seconds holding each time; null for a null time. Windows
    are aligned to the epoch (`Window.at`): floored, also before 1970."""
    size = window_s * 1000
    if isinstance(times_ms, pa.ChunkedArray):
        times_ms = times_ms.combine_chunks() if times_ms.num_chunks else pa.array([], pa.int64())
    # Exact for any time in milliseconds below 2**53: a quotient short of an integer by at least 1/size stays so.
    floored = pc.floor(pc.divide(times_ms.cast(pa.float64()), float(size)))
    return pc.multiply(floored.cast(pa.int64()), size)


def window_key(start_ms: int | None, window_s: int) -> str:
    return UNASSIGNED if start_ms is None else Window(start_ms, start_ms + window_s * 1000).key


def per_window(times_ms: Column, window_s: int, *by: Column) -> Counter:
    """How many times fall in each window (by key, `unassigned` for null), or with columns `by`, in each
    (window, value, ...)."""
    columns = {"start": window_starts(times_ms, window_s), **{f"by{i}": c for i, c in enumerate(by)}}
    keys = list(columns)
    grouped = pa.table(columns).group_by(keys).aggregate([([], "count_all")])
    counts: Counter = Counter()
    for row in grouped.to_pylist():
        window = window_key(row["start"], window_s)
        counts[(window, *(row[k] for k in keys[1:])) if by else window] += row["count_all"]
    return counts
