"""The dedup fast path (DESIGN 4, Dataflow's Bloom filters): which of a batch's record IDs may be committed already.

The raw table is the dedup catalog; looking a batch up in it costs a scan of every record ID inside the dedup
horizon, which grows with the table. These filters keep that cost flat: one Bloom filter of committed record
IDs per time bucket of the raw table, all stamped with the one table version they reflect. A batch's IDs are
probed against every bucket's filter; an ID no filter holds is proven new, and only the buckets whose filters
answer "maybe" are looked up in the table (a partition predicate on the MERGE).

The filters are derived state and never the authority. Missing, unreadable, from another hashing scheme, another
table (its Delta id) or another hash implementation (a test vector of hashes), or saturated: rebuilt from the
table. Behind the table: caught up from the Delta log (the record IDs of every
data-changing commit since their stamp). A filter can only ever hold too much (a false "maybe", which costs a
lookup), never too little, so a batch deduplicated through them is exactly what the full MERGE would give.
Because the log can always bring them up to date, a process keeps its filters in memory between batches and saves
them only every `onceflow.jobs.dedup.filter_store.SAVE_EVERY_VERSIONS` table versions.

Each filter is a blocked Bloom filter: an ID sets `PROBES` bits within each of two 64-bit words, so probing a
whole batch against a bucket is a few vectorised numpy operations. (With one word per ID, false "maybe"s summed
over many buckets often enough to cost bucket reads; two words make them rare, even at a filter's nominal capacity.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from onceflow.jobs.dedup.log_ids import recent_ids
from onceflow.resources.delta_storage import table_snapshot

SCHEME = "siphash24-onceflow1/blocked64x5x2"
"""Names the hashing and layout; filters written under another scheme are rebuilt, never trusted."""
_HASH_KEY = "onceflow-ids-001"
PROBES = 5
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
BITS_PER_ID = 16
MIN_WORDS = 1 << 10


def id_hashes(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each record ID (SipHash-2-4 over its UTF-8 bytes, fixed key): stable across processes."""
    values = np.asarray(ids.to_numpy(zero_copy_only=False), dtype=object)
    return pd.util.hash_array(values, hash_key=_HASH_KEY, categorize=False)


_TEST_VECTOR_IDS = ("", "a", "events/files:0", "ünïcode-€-1", "0" * 64)


def hash_test_vector() -> list[int]:
    """The hashes of a few fixed IDs as this process computes them. Saved filters record them: filters hashed by
    another implementation (a pandas release that hashes differently) answer for other bits and are rebuilt."""
    return [int(h) for h in id_hashes(pa.array(_TEST_VECTOR_IDS))]


def _words_and_masks(hashes: np.ndarray, words: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each ID, two (word index, bit mask) pairs: from its hash, and from the hash remixed (Fibonacci
    hashing) so that the second word and bits do not follow from the first."""
    pairs = []
    for bits in (hashes, hashes * _GOLDEN):
        index = (bits & np.uint64(words - 1)).astype(np.int64)
        high = bits >> np.uint64(32)
        mask = np.zeros(len(bits), dtype=np.uint64)
        for probe in range(PROBES):
            mask |= np.uint64(1) << ((high >> np.uint64(6 * probe)) & np.uint64(63))
        pairs.append((index, mask))
    return pairs


@dataclass
class BucketFilter:
    """The IDs committed in one time bucket; `count` is how many were added (with repeats)."""

    words: np.ndarray
    count: int = 0

    @classmethod
    def sized_for(cls, ids: int) -> BucketFilter:
        words = max(MIN_WORDS, 1 << int(np.ceil(np.log2(max(ids, 1) * 2 * BITS_PER_ID / 64))))
        return cls(np.zeros(words, dtype=np.uint64))

    @property
    def saturated(self) -> bool:
        return self.count * BITS_PER_ID > len(self.words) * 64

    def add(self, hashes: np.ndarray) -> None:
        for index, mask in _words_and_masks(hashes, len(self.words)):
            np.bitwise_or.at(self.words, index, mask)
        self.count += len(hashes)

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        (first, first_mask), (second, second_mask) = _words_and_masks(hashes, len(self.words))
        return ((self.words[first] & first_mask) == first_mask) & ((self.words[second] & second_mask) == second_mask)


class FilterManifest(BaseModel):
    """The saved form of a table's filters: the table they describe (its Delta id: a table re-created at the same
    path has commits of the same numbers), the hashes of the test vector they were made with, their version and,
    per bucket, its file, ID count and digest."""

    scheme: str
    table_id: str = ""
    test_vector: list[int] = []
    version: int
    covered_from: int | None = None
    buckets: dict[int, str] = {}
    counts: dict[int, int] = {}
    digests: dict[int, str] = {}


@dataclass
class IdFilters:
    """The filters of one raw table as of `version`: every ID that commits up to it wrote in a bucket from
    `covered_from` on (all buckets when None) is in its bucket's filter.

    `base` is the saved manifest they were read from (None when built from the table) and `unsaved` the buckets
    changed since: a bucket outside it is still exactly the file `base` names for it."""

    version: int
    table_id: str = ""
    buckets: dict[int, BucketFilter] = field(default_factory=dict)
    covered_from: int | None = None
    rebuilt: bool = False
    caught_up: int = 0
    base: FilterManifest | None = None
    unsaved: set[int] = field(default_factory=set)

    def maybe_seen(self, hashes: np.ndarray) -> tuple[np.ndarray, set[int]]:
        """Which IDs may be committed (a boolean per ID), and the buckets that may hold them."""
        maybe = np.zeros(len(hashes), dtype=bool)
        where: set[int] = set()
        for bucket, bloom in self.buckets.items():
            hit = bloom.might_contain(hashes)
            if hit.any():
                maybe |= hit
                where.add(bucket)
        return maybe, where

    def add(self, hashes: np.ndarray, buckets: np.ndarray) -> None:
        """Add IDs to their buckets' filters. A filter past its capacity keeps taking IDs (it only answers "maybe"
        more often) until the next load refills it larger from the table."""
        for bucket in np.unique(buckets):
            mine = hashes[buckets == bucket]
            bloom = self.buckets.setdefault(int(bucket), BucketFilter.sized_for(len(mine) * 4))
            bloom.add(mine)
            self.unsaved.add(int(bucket))

    def drop_below(self, floor_bucket: int | None) -> None:
        """Rolling: buckets below the dedup horizon are never looked up again."""
        if floor_bucket is not None:
            for bucket in [b for b in self.buckets if b < floor_bucket]:
                del self.buckets[bucket]
            self.covered_from = floor_bucket if self.covered_from is None else max(self.covered_from, floor_bucket)


def committed_among(
    filters: IdFilters, table_path: str, candidates: pa.Array | pa.ChunkedArray
) -> tuple[list[str], int]:
    """Which of `candidates` (IDs the filters answered "maybe" for) the table held at the filters' version: the
    exact lookup. Returns them and how many buckets had to be looked up.

    Repeats are mostly recent (publisher retries, redeliveries), so the rows of the last few commits (see
    `recent_ids`) are looked at first, a cost that does not grow with the table; only IDs not found there are
    looked up in the buckets whose filters name them.
    """
    if isinstance(candidates, pa.ChunkedArray):
        candidates = candidates.combine_chunks()
    candidates = candidates.cast(pa.string())  # the type of the table's IDs as read back
    table = table_snapshot(table_path, version=filters.version)
    try:
        recent = pa.chunked_array([ids.cast(pa.string()) for ids in recent_ids(table, filters.version)], pa.string())
    except FileNotFoundError:
        recent = pa.chunked_array([], pa.string())
    # The few candidates are the set the recent IDs are probed against (not the other way round: hashing the
    # candidates is cheaper than building a set of every recent ID on every batch).
    seen = recent.filter(pc.is_in(recent, value_set=candidates)).combine_chunks()
    rest = candidates.filter(pc.invert(pc.is_in(candidates, value_set=seen)))
    _, buckets = filters.maybe_seen(id_hashes(rest)) if len(rest) else (None, set())
    if buckets:
        # The IDs' own predicate skips every file whose record_id range (its Delta statistics) holds none of them:
        # a batch's IDs mostly come from a narrow range (message IDs, offsets, lines), so a redelivery of old
        # records reads the few files that hold them rather than whole buckets. Delta's writer keeps a long
        # string's maximum an upper bound (a prefix, then U+10FFFF), so no file that holds one is skipped.
        where = pc.field("time_bucket").isin(sorted(buckets)) & pc.field("record_id").isin(rest)
        held = table.to_pyarrow_table(columns=["record_id"], filters=where)
        seen = pa.concat_arrays([seen, rest.filter(pc.is_in(rest, value_set=held["record_id"].combine_chunks()))])
    return seen.unique().to_pylist(), len(buckets)
