"""The dedup fast path (DESIGN 4): which of a batch's record IDs the raw table holds already, without reading it.

The raw table is the dedup catalog; looking a batch up in it costs a scan of every record ID inside the dedup
horizon, which grows with the table. These filters keep that cost flat: per time bucket of the raw table, the
sorted 128-bit fingerprints of the record IDs committed in it, all stamped with the one table version they
reflect. A batch's IDs are searched in all buckets' fingerprints at once, kept in one sorted run (a binary search
each: the cost grows with the log of the horizon's size, not with the rows, wherever in the horizon a repeat comes
from).

A fingerprint is two independent keyed 64-bit SipHash-2-4 values of the ID's UTF-8 bytes. Two distinct IDs share
one with probability 2^-128, so a batch of b fresh IDs checked against n committed ones takes one for a repeat with
probability at most b*n/2^128 (10^-27 for 25,000 against 10^7): far below the undetected-error rate of the checksums
the table's own files rely on. That is why a fingerprint found is a repeat, with no read of the table to confirm it.
(Bloom filters confirmed by table reads, as Dataflow does with its catalog, read whole buckets once a redelivery's
IDs fall all over the horizon; Hudi's record-level index is the exact, keyed index this is closest to.)

The filters are derived state and never the authority. Missing, unreadable, from another hashing scheme, another
table (its Delta id) or another hash implementation (a test vector of hashes): rebuilt from the table. Behind the
table: caught up from the Delta log, adding the record IDs of every data-changing commit since their stamp, and
rebuilding from the table any bucket a commit removed rows from (a DELETE, a RESTORE): fingerprints of rows the
table no longer holds would drop their records' redeliveries, where the full MERGE would insert them. So a batch
deduplicated through them is exactly what the full MERGE would give. Because the log can always bring them up to
date, a process keeps its filters in memory between batches and saves them only every
`onceflow.jobs.dedup.filter_store.SAVE_EVERY_VERSIONS` table versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import BaseModel

SCHEME = "siphash24x2-onceflow2/sorted128"
"""Names the hashing and layout; filters written under another scheme are rebuilt, never trusted."""
_HASH_KEYS = ("onceflow-ids-001", "onceflow-ids-002")
ID_HASH_COLUMNS = ("id_hash_first", "id_hash_second")
"""A batch's fingerprint halves, where its Spark stage computed them (`id_hash_sql`)."""


@dataclass(frozen=True)
class Fingerprints:
    """Each ID's 128-bit fingerprint as two 64-bit halves: `first` (the sort and search key) and `second`."""

    first: np.ndarray
    second: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def take(self, where: np.ndarray) -> Fingerprints:
        return Fingerprints(self.first[where], self.second[where])

    @staticmethod
    def concat(parts: list[Fingerprints]) -> Fingerprints:
        return Fingerprints(np.concatenate([p.first for p in parts] or [np.zeros(0, np.uint64)]),
                            np.concatenate([p.second for p in parts] or [np.zeros(0, np.uint64)]))


def id_hashes(ids: pa.Array | pa.ChunkedArray) -> Fingerprints:
    """The fingerprint of each record ID: stable across processes (fixed keys)."""
    values = np.asarray(ids.to_numpy(zero_copy_only=False), dtype=object)
    first, second = (pd.util.hash_array(values, hash_key=key, categorize=False) for key in _HASH_KEYS)
    return Fingerprints(first, second)


def id_hash_sql(column: str = "record_id") -> tuple[str, ...]:
    """SQL outputs computing the fingerprint halves of `column` in a Spark stage, on its executors, bit for bit as
    `id_hashes` does (`onceflow_id_hash`, `IdHash.java`: classic sessions only)."""
    return tuple(f"onceflow_id_hash({column}, '{key}') AS {name}" for key, name in zip(_HASH_KEYS, ID_HASH_COLUMNS, strict=True))


def batch_fingerprints(ids: pa.Table) -> Fingerprints:
    """The fingerprints of the (non-NULL) record IDs of `ids`: from its `ID_HASH_COLUMNS` where the batch's Spark
    stage computed them, else hashed here."""
    if ID_HASH_COLUMNS[0] not in ids.column_names:
        return id_hashes(ids["record_id"])
    first, second = (ids[name].to_numpy().view(np.uint64) for name in ID_HASH_COLUMNS)
    return Fingerprints(first, second)


_TEST_VECTOR_IDS = ("", "a", "events/files:0", "ünïcode-€-1", "0" * 64)


def hash_test_vector() -> list[int]:
    """The fingerprints of a few fixed IDs as this process computes them. Saved filters record them: filters
    hashed by another implementation (a pandas release that hashes differently) answer for other IDs and are
    rebuilt."""
    prints = id_hashes(pa.array(_TEST_VECTOR_IDS))
    return [int(h) for pair in zip(prints.first, prints.second, strict=True) for h in pair]


class BucketFilter:
    """The fingerprints of the IDs committed in one time bucket, sorted by their first half (repeats kept).

    IDs added wait beside the sorted run and are merged into it only when the bucket is read whole (saved, or
    searched on its own): adding a batch's IDs costs their number, not the bucket's (a copy of a full bucket per
    batch grew with the table)."""

    def __init__(self, prints: Fingerprints | None = None) -> None:
        self._sorted = prints if prints is not None else Fingerprints.concat([])
        self._added: list[Fingerprints] = []

    @property
    def prints(self) -> Fingerprints:
        """Every fingerprint, sorted by its first half."""
        if self._added:
            self._sorted, _ = _merged(self._sorted, BucketFilter.of(Fingerprints.concat(self._added)).prints)
            self._added = []
        return self._sorted

    @property
    def count(self) -> int:
        return len(self._sorted) + sum(len(added) for added in self._added)

    @classmethod
    def of(cls, prints: Fingerprints) -> BucketFilter:
        order = np.argsort(prints.first, kind="stable")
        return cls(prints.take(order))

    def add(self, prints: Fingerprints) -> None:
        self._added.append(prints)

    def contains(self, prints: Fingerprints) -> np.ndarray:
        """Whether each fingerprint is in the bucket (a boolean per fingerprint); fastest with `prints` sorted by
        their first half, as each search then starts where the last one ended."""
        held = self.prints
        size = len(held)
        if not size:
            return np.zeros(len(prints), dtype=bool)
        start = np.searchsorted(held.first, prints.first)
        at = np.minimum(start, size - 1)
        same = held.first[at] == prints.first
        found = same & (held.second[at] == prints.second)
        # Distinct IDs sharing a first half (about n^2/2^65 pairs in a bucket of n): look along the whole run.
        after = np.minimum(start + 1, size - 1)
        for i in np.flatnonzero(same & ~found & (start + 1 < size) & (held.first[after] == prints.first)):
            end = np.searchsorted(held.first, prints.first[i], side="right")
            found[i] = bool((held.second[start[i] : end] == prints.second[i]).any())
        return found

    def to_bytes(self) -> bytes:
        return self.prints.first.tobytes() + self.prints.second.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> BucketFilter:
        """The inverse of `to_bytes`; raises ValueError on a length that cannot be one."""
        words = np.frombuffer(data, dtype=np.uint64)
        if len(words) % 2:
            raise ValueError("a bucket's fingerprints are pairs of 64-bit words")
        half = len(words) // 2
        return cls(Fingerprints(words[:half].copy(), words[half:].copy()))


def _merged(held: Fingerprints, new: Fingerprints) -> tuple[Fingerprints, np.ndarray]:
    """Two runs sorted by first half as one (each of `new` after `held`'s equal keys), in one pass over both; and
    where in `held` each of `new` went."""
    at = np.searchsorted(held.first, new.first, side="right")
    return Fingerprints(np.insert(held.first, at, new.first), np.insert(held.second, at, new.second)), at


@dataclass(frozen=True)
class _Index:
    """Fingerprints of several buckets in one run sorted by first half, with each one's bucket (`owners`)."""

    prints: Fingerprints
    owners: np.ndarray

    def __len__(self) -> int:
        return len(self.owners)

    @classmethod
    def of(cls, prints: Fingerprints, owners: np.ndarray) -> _Index:
        order = np.argsort(prints.first, kind="stable")
        return cls(prints.take(order), owners[order])

    def merged(self, other: _Index) -> _Index:
        prints, at = _merged(self.prints, other.prints)
        return _Index(prints, np.insert(self.owners, at, other.owners))

    def from_bucket(self, floor_bucket: int) -> _Index:
        keep = self.owners >= floor_bucket
        return _Index(self.prints.take(keep), self.owners[keep])


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
    _index: _Index | None = field(default=None, repr=False, compare=False)
    """Every bucket's fingerprints in one sorted run (`index`), and those added since (`_recent`), merged into it
    once they are a sixteenth of it: a batch's IDs are searched twice, not once per bucket (20 searches of 25,000
    IDs took 25 ms at 1 M IDs and 37 ms at 10 M; two take 5 and 11), and an add costs about its own size."""
    _recent: _Index | None = field(default=None, repr=False, compare=False)

    def seen(self, prints: Fingerprints) -> np.ndarray:
        """Which IDs the table held at `version` in the buckets covered (a boolean per ID), whatever bucket each
        was committed in: an ID's bucket follows its event time, which a producer's retry may have changed."""
        order = np.argsort(prints.first, kind="stable")
        pending = prints.take(order)
        if self._index is None and len(self.buckets) * len(prints) > sum(b.count for b in self.buckets.values()):
            # Many buckets for what they hold (a horizon of hours, each with few IDs; a backfill of a year): one
            # sort of all their fingerprints costs less than a search of every ID in every bucket.
            self.index()
        if self._index is None:  # searched bucket by bucket until the one run is made (`index`)
            found = np.zeros(len(prints), dtype=bool)
            for bucket in self.buckets.values():
                unseen = np.flatnonzero(~found)  # still sorted: each bucket is searched in order
                if not len(unseen):
                    break
                found[unseen] = bucket.contains(pending.take(unseen))
        else:
            found = BucketFilter(self._index.prints).contains(pending)
            if self._recent is not None:
                found |= BucketFilter(self._recent.prints).contains(pending)
        seen = np.empty_like(found)
        seen[order] = found
        return seen

    def index(self) -> None:
        """Make the one sorted run of every bucket's fingerprints (`_index`) unless it is made: beside a process's
        batches (`onceflow.jobs.dedup.filter_store.IdFilterStore.release_later`), as for 10 M IDs it takes a
        second that a batch would wait for."""
        if self._index is None:
            held = {bucket: f.prints for bucket, f in self.buckets.items()}
            owners = [np.full(len(p), bucket, np.int64) for bucket, p in held.items()]
            self._index = _Index.of(Fingerprints.concat(list(held.values())),
                                    np.concatenate(owners or [np.zeros(0, np.int64)]))

    def add(self, prints: Fingerprints, buckets: np.ndarray) -> None:
        """Add IDs to their buckets' filters."""
        if not len(buckets):
            return
        order = np.argsort(buckets, kind="stable")
        keys, starts = np.unique(buckets[order], return_index=True)
        for bucket, part in zip(keys.tolist(), np.split(order, starts[1:]), strict=True):
            self.buckets.setdefault(bucket, BucketFilter()).add(prints.take(part))
            self.unsaved.add(bucket)
        if self._index is not None:
            added = _Index.of(prints, buckets.astype(np.int64))
            self._recent = added if self._recent is None else self._recent.merged(added)
            if len(self._recent) * 16 > len(self._index):
                self._index, self._recent = self._index.merged(self._recent), None

    def refill(self, bucket: int, refilled: BucketFilter) -> None:
        """Replace a bucket's filter whole (its rows were removed from the table)."""
        self.buckets[bucket] = refilled
        self.unsaved.add(bucket)
        self._index = self._recent = None  # made again from the buckets at the next `seen`

    def drop_below(self, floor_bucket: int | None) -> None:
        """Rolling: buckets below the dedup horizon are never looked up again."""
        if floor_bucket is not None:
            dropped = [b for b in self.buckets if b < floor_bucket]
            for bucket in dropped:
                del self.buckets[bucket]
            if dropped and self._index is not None:
                self._index = self._index.from_bucket(floor_bucket)
                self._recent = None if self._recent is None else self._recent.from_bucket(floor_bucket)
            self.covered_from = floor_bucket if self.covered_from is None else max(self.covered_from, floor_bucket)

