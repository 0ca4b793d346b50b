"""Which record of a batch is kept for each record ID (`onceflow.jobs.dedup.first_records.first_ids`)."""

from __future__ import annotations

import random

import pyarrow as pa

from onceflow.jobs.dedup.first_records import first_ids


def _by_grouping(rows: pa.Table) -> tuple[set[int], set[int]]:
    """The ordinals kept and dropped, by the definition: the smallest ordinal of each ID (NULL is one ID)."""
    smallest: dict[str | None, int] = {}
    for record_id, ordinal in zip(rows["record_id"].to_pylist(), rows["ordinal"].to_pylist(), strict=True):
        smallest[record_id] = min(ordinal, smallest.get(record_id, ordinal))
    kept = set(smallest.values())
    return kept, set(rows["ordinal"].to_pylist()) - kept


def test_the_first_record_of_each_id_in_landing_order_is_kept_whatever_order_the_rows_come_in() -> None:
    rng = random.Random(5)
    for size in (0, 1, 2, 50, 3000):
        ids = [rng.choice([None, *(f"id-{rng.randrange(size // 3 + 1)}" for _ in range(3))]) for _ in range(size)]
        # Streams of the batch (files) as the engine returns them: runs in order, the runs in any order.
        ordinals = [stream * (1 << 40) + offset for stream in range(4) for offset in range(0, 40 * size, 40)][:size]
        runs = [ordinals[i : i + max(size // 4, 1)] for i in range(0, size, max(size // 4, 1))]
        rng.shuffle(runs)
        landed = [o for run in runs for o in run]
        rows = pa.table({"record_id": pa.array(ids, pa.string()), "time_bucket": pa.array([o % 7 for o in landed]),
                         "ordinal": pa.array(landed, pa.int64())})
        # In two chunks, as a table read in parts is.
        rows = pa.concat_tables([rows.slice(0, size // 2), rows.slice(size // 2)])
        firsts, mask = first_ids(rows)
        kept, dropped = _by_grouping(rows)
        assert set(firsts["ordinal"].to_pylist()) == kept and len(firsts) == len(kept)
        # The mask marks those very rows of `rows`.
        assert rows["ordinal"].filter(pa.array(mask)).to_pylist() == firsts["ordinal"].to_pylist()
        rest = rows["ordinal"].filter(pa.array(~mask)).to_pylist()
        assert set(rest) == dropped and len(rest) == len(dropped)
        # Each kept row keeps its own ID and bucket.
        by_ordinal = dict(zip(landed, zip(ids, (o % 7 for o in landed), strict=True), strict=True))
        assert all(by_ordinal[o] == (i, b) for i, b, o in zip(*(firsts[c].to_pylist() for c in
                                                                 ("record_id", "time_bucket", "ordinal")), strict=True))
