"""Which record of a batch is kept for each record ID (`onceflow.jobs.dedup.first_records`: `first_ids`, and
`first_prints` by fingerprint)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from onceflow.jobs.dedup.fingerprints import ID_HASH_COLUMNS, id_hashes
from onceflow.jobs.dedup.first_records import first_ids, first_prints


def _by_grouping(rows: pa.Table) -> tuple[set[int], set[int]]:
    """The ordinals kept and dropped, by the definition: the smallest ordinal of each ID (NULL is one ID)."""
    smallest: dict[str | None, int] = {}
    for record_id, ordinal in zip(rows["record_id"].to_pylist(), rows["ordinal"].to_pylist(), strict=True):
        smallest[record_id] = min(ordinal, smallest.get(record_id, ordinal))
    kept = set(smallest.values())
    return kept, set(rows["ordinal"].to_pylist()) - kept


def _landed(rng: random.Random, size: int) -> list[int]:
    """Ordinals of a batch's rows as the engine returns them: streams (files) in runs in order, the runs in any
    order."""
    ordinals = [stream * (1 << 40) + offset for stream in range(4) for offset in range(0, 40 * size, 40)][:size]
    runs = [ordinals[i : i + max(size // 4, 1)] for i in range(0, size, max(size // 4, 1))]
    rng.shuffle(runs)
    return [o for run in runs for o in run]


def test_the_first_record_of_each_id_in_landing_order_is_kept_whatever_order_the_rows_come_in() -> None:
    rng = random.Random(5)
    for size in (0, 1, 2, 50, 3000):
        ids = [rng.choice([None, *(f"id-{rng.randrange(size // 3 + 1)}" for _ in range(3))]) for _ in range(size)]
        landed = _landed(rng, size)
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


def test_the_first_record_of_each_fingerprint_is_the_first_of_its_id_and_they_come_sorted() -> None:
    rng = random.Random(7)
    for size in (0, 1, 2, 50, 3000):
        ids = [f"id-{rng.randrange(size // 3 + 1)}" for _ in range(size)]
        rows = pa.table({"record_id": pa.array(ids, pa.string()), "ordinal": pa.array(_landed(rng, size), pa.int64())})
        kept, _ = _by_grouping(rows)
        prints = id_hashes(rows["record_id"])
        # The halves as the Spark stage gives them; then first halves that many IDs share, interleaved in the sort
        # (a 2^-64 chance each for real IDs): the second halves must still tell the IDs apart.
        for first in (prints.first, prints.first % np.uint64(3)):
            halves = {ID_HASH_COLUMNS[0]: first.view(np.int64), ID_HASH_COLUMNS[1]: prints.second.view(np.int64)}
            hashed = pa.table({"ordinal": rows["ordinal"], **halves})
            for table, expected_first in ((hashed, first), (rows, prints.first)):  # without the halves: hashed here
                got, at = first_prints(table)
                assert set(rows["ordinal"].take(pa.array(at, pa.int64())).to_pylist()) == kept and len(at) == len(kept)
                assert np.array_equal(got.first, expected_first[at]) and np.array_equal(got.second, prints.second[at])
                assert np.all(got.first[1:] >= got.first[:-1])
