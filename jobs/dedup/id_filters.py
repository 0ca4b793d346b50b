"""The dedup fast path (DESIGN 4): which of a batch's record IDs the raw table holds already, without reading it.

The raw table is the dedup catalog; looking a batch up in it costs a scan of every record ID inside the dedup
horizon, which grows with the table. These filters keep that cost flat: per time bucket of the raw table, the
sorted 128-bit fingerprints of the record IDs committed in it, all stamped with the one table version they
reflect. A batch's IDs are searched in all buckets' fingerprints at once, kept in one sorted run (a binary search
each: the cost grows with the log of the horizon's size, not with the rows, wherever in the horizon a repeat comes
from).

A fingerprint (`onceflow.jobs.dedup.fingerprints`) found is a repeat, with no read of the table to confirm it.
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
from pydantic import BaseModel

from onceflow.jobs.dedup.fingerprints import Fingerprints

SCHEME = "siphash24x2-onceflow2/sorted128"
"""Names the hashing and layout; filters written under another scheme are rebuilt, never trusted."""


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
            added = BucketFilter.of(Fingerprints.concat(self._added)).prints
            self._sorted = Fingerprints(*_merged((self._sorted.first, self._sorted.second), (added.first, added.second)))
            self._added = []
        return self._sorted

    @property
    def count(self) -> int:
        return len(self._sorted) + sum(len(added) for added in self._added)

    @classmethod
    def of(cls, prints: Fingerprints) -> BucketFilter:
        order = np.argsort(prints.first)
        return cls(prints.take(order))

    def add(self, prints: Fingerprints) -> None:
        self._added.append(prints)

    def contains(self, prints: Fingerprints, directory: tuple[np.ndarray, int] | None = None) -> np.ndarray:
        """Whether each fingerprint is in the bucket (a boolean per fingerprint); fastest with `prints` sorted by
        their first half, as each search then starts where the last one ended. `directory`: the run's `_directory`."""
        held = self.prints
        size = len(held)
        if not size:
            return np.zeros(len(prints), dtype=bool)
        start = _first_at_least(held.first, prints.first, directory)
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


_DIRECTORY_FROM = 1 << 21
_PER_BLOCK = 4


def _directory(first: np.ndarray) -> tuple[np.ndarray, int] | None:
    """For a sorted run of more than 2 M first halves (16 MB: beyond a processor's caches), else None: where each
    block of first halves sharing their leading bits starts, the blocks about four long (fingerprints are uniform),
    and the shift that leaves a first half's block.

    A search reads a key's block bounds, then a few adjacent first halves: a binary search of a whole run misses
    the caches at most of its steps (its cost against this one's: docs/performance.md, "Measured choices")."""
    if len(first) <= _DIRECTORY_FROM:
        return None
    bits = max(1, (len(first) // _PER_BLOCK).bit_length())
    shift = 64 - bits
    starts = np.zeros((1 << bits) + 1, dtype=np.int64)
    np.cumsum(np.bincount((first >> np.uint64(shift)).astype(np.intp), minlength=1 << bits), out=starts[1:])
    return starts, shift


def _first_at_least(first: np.ndarray, keys: np.ndarray, directory: tuple[np.ndarray, int] | None) -> np.ndarray:
    """`np.searchsorted(first, keys)`, through `directory` (`_directory(first)`) when given: each key's answer is
    within its block's bounds, searched by halves together."""
    if directory is None:
        return np.searchsorted(first, keys)
    starts, shift = directory
    block = (keys >> np.uint64(shift)).astype(np.intp)
    lo, hi = starts[block], starts[block + 1]
    for _ in range(int((hi - lo).max(initial=0)).bit_length()):
        mid = (lo + hi) // 2
        open_, below = lo < hi, first[np.minimum(mid, len(first) - 1)] < keys
        lo, hi = np.where(open_ & below, mid + 1, lo), np.where(open_ & ~below, mid, hi)
    return lo


def _merged(held: tuple[np.ndarray, ...], new: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """Two runs sorted by their first array (fingerprints' first halves) as one, each of `new` after `held`'s equal
    keys; the other arrays (second halves, owners) follow their keys. One pass over both runs: placed by one mask
    for every array (`np.insert` made a mask per array, and a merge cost a fifth more)."""
    spots = np.searchsorted(held[0], new[0], side="right") + np.arange(len(new[0]))
    from_held = np.ones(len(held[0]) + len(new[0]), dtype=bool)
    from_held[spots] = False
    merged = []
    for old, added in zip(held, new, strict=True):
        both = np.empty(len(from_held), dtype=old.dtype)
        both[spots], both[from_held] = added, old
        merged.append(both)
    return merged


@dataclass(frozen=True)
class _Index:
    """Fingerprints of several buckets in one run sorted by first half, with each one's bucket (`owners`)."""

    prints: Fingerprints
    owners: np.ndarray
    directory: tuple[np.ndarray, int] | None = field(init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.owners)

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", _directory(self.prints.first))  # made with the run, beside the batches

    @classmethod
    def of(cls, prints: Fingerprints, owners: np.ndarray) -> _Index:
        order = np.argsort(prints.first)
        return cls(prints.take(order), owners[order])

    def merged(self, other: _Index) -> _Index:
        first, second, owners = _merged((self.prints.first, self.prints.second, self.owners),
                                        (other.prints.first, other.prints.second, other.owners))
        return _Index(Fingerprints(first, second), owners)

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
    once they are a sixteenth of it: a batch's IDs are searched twice, not once per bucket, and an add costs about
    its own size."""
    _recent: _Index | None = field(default=None, repr=False, compare=False)

    def seen(self, prints: Fingerprints) -> np.ndarray:
        """Which IDs the table held at `version` in the buckets covered (a boolean per ID), whatever bucket each
        was committed in: an ID's bucket follows its event time, which a producer's retry may have changed."""
        order = np.argsort(prints.first)
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
            found = BucketFilter(self._index.prints).contains(pending, self._index.directory)
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

