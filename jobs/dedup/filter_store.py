"""Where a table's ID filters (`onceflow.jobs.dedup.id_filters`) are kept between batches: in memory in the process that used
them last, and saved in an object store every so often for other processes and later runs."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ClassVar

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from onceflow.jobs.dedup.buckets import TIME_BUCKETS, Bucketing
from onceflow.jobs.dedup.fingerprints import Fingerprints, hash_test_vector, id_hashes
from onceflow.jobs.dedup.id_filters import SCHEME, BucketFilter, FilterManifest, IdFilters
from onceflow.jobs.dedup.log_ids import changes_since
from onceflow.resources.delta_storage import table_head, table_snapshot
from onceflow.resources.object_store import ObjectStore

log = logging.getLogger("onceflow")

SAVE_EVERY_VERSIONS = 16
"""How far, in table versions, the saved filters may fall behind those a process holds. A save writes each changed
bucket whole (a full bucket's filter is large, so saving on every batch cost more as the table grew); a process
that starts from the saved filters catches up by reading at most this many commits' IDs."""


class IdFilterStore:
    """Persists a table's filters in an object store (`<key>/manifest.json`, `<key>/<bucket>-<version>.ids`), its
    rows placed in buckets by `bucketing` (a raw table's time buckets by default).

    The manifest is replaced last and names immutable bucket files, so a reader sees one consistent set; a
    bucket file that is missing (a concurrent writer's clean-up, a deleted directory) is rebuilt from the table.
    A save names a bucket's file from the manifest the filters were read from only if the bucket has not changed
    since; every other bucket is written anew, so no file named can lack an ID the manifest's version covers.
    """

    _held: ClassVar[dict[str, IdFilters]] = {}
    """The filters this process holds, per table: a warm run's next batch takes them from here (while the manifest
    they descend from is still the saved one) instead of reading and hashing every bucket again. Taken out while a
    batch uses them, so only a finished batch's state is ever reused."""
    _held_lock = threading.Lock()
    _pending: ClassVar[dict[str, Future]] = {}
    """Per table, the last batch's upkeep of its filters (`release_later`), which the next `load` waits for."""
    _upkeep = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-id-filters")

    def __init__(self, store: ObjectStore, key: str, table_path: str, bucketing: Bucketing = TIME_BUCKETS) -> None:
        self.store, self.key, self.table_path, self.bucketing = store, key, table_path, bucketing

    def load(self, floor_bucket: int | None) -> IdFilters:
        """The filters, caught up to the table's current version (rebuilt from the table when unusable), once the
        last batch's upkeep of them is done."""
        with self._held_lock:
            pending = self._pending.pop(self.table_path, None)
        if pending is not None and pending.exception() is not None:
            # Derived state: filters not handed back are read again (or rebuilt) and caught up from the log.
            log.warning(f"{self.key}: the last batch's upkeep of its ID filters failed: {pending.exception()!r}")
        latest, table_id = table_head(self.table_path)
        filters = self._read(floor_bucket, table_id)
        if filters is None or filters.version > latest:
            return self._rebuild(latest, floor_bucket, table_id)
        try:
            added, emptied = changes_since(self.table_path, filters.version, latest, self.bucketing)
        except FileNotFoundError:  # the log entries since the stamp are gone (log retention): start over
            return self._rebuild(latest, floor_bucket, table_id)
        if emptied is None:  # rows removed from a bucket the log does not name
            return self._rebuild(latest, floor_bucket, table_id)
        filters.add(id_hashes(added["record_id"]), added["bucket"].to_numpy())
        filters.caught_up, filters.version = latest - filters.version, latest
        for bucket in emptied & set(filters.buckets):  # refilled from what the table holds now
            refill = [(self.bucketing.partition, "=", bucket)]
            filters.refill(bucket, self._filled(latest, refill).get(bucket, BucketFilter()))
        return filters

    def release(self, filters: IdFilters) -> None:
        """Hand the filters back after a batch: saved when due (built from the table, or `SAVE_EVERY_VERSIONS`
        past the saved ones), else held by this process only."""
        if filters.base is None or filters.version - filters.base.version >= SAVE_EVERY_VERSIONS:
            self.save(filters)
        else:
            with self._held_lock:
                self._held[self.table_path] = filters

    def release_later(self, filters: IdFilters, upkeep: Callable[[IdFilters], None]) -> None:
        """`upkeep(filters)` (a committed batch's IDs joining them), their one sorted run made if it is not
        (`IdFilters.index`), then `release`, beside what the process does next: its next batch's `load` waits for
        them. A process killed before they finish loses nothing: the filters are derived state, caught up from the
        log by whoever loads them next."""

        def kept() -> None:
            upkeep(filters)
            filters.index()
            self.release(filters)

        with self._held_lock:
            self._pending[self.table_path] = self._upkeep.submit(kept)

    @classmethod
    def settle(cls) -> None:
        """Wait until every table's pending upkeep (`release_later`) is done: its filters saved or held."""
        with cls._held_lock:
            pending = list(cls._pending.values())
        for upkeep in pending:
            upkeep.exception()  # waits; a failure is reported by the table's next `load`

    @classmethod
    def forget(cls) -> None:
        """`settle`, then let go of the filters every table holds: as a new process would find them."""
        cls.settle()
        with cls._held_lock:
            cls._held.clear()

    def save(self, filters: IdFilters) -> None:
        """Write the buckets changed since the manifest the filters were read from, then a manifest naming those
        and that manifest's files for the rest, stamped with the filters' version."""
        base = filters.base or FilterManifest(scheme=SCHEME, version=-1)  # built from the table: nothing to keep
        kept = {b for b in filters.buckets if b in base.buckets and b in base.digests and b not in filters.unsaved}
        names = {b: base.buckets[b] for b in kept}
        digests = {b: base.digests[b] for b in kept}
        for bucket in set(filters.buckets) - kept:
            name, data = f"{bucket}-{filters.version}.ids", filters.buckets[bucket].to_bytes()
            self.store.write(f"{self.key}/{name}", data)
            names[bucket], digests[bucket] = name, hashlib.sha256(data).hexdigest()
        manifest = FilterManifest(scheme=SCHEME, table_id=filters.table_id, test_vector=hash_test_vector(),
                                  version=filters.version, covered_from=filters.covered_from, buckets=names,
                                  counts={b: filters.buckets[b].count for b in names}, digests=digests)
        old = self._manifest()
        self.store.write(f"{self.key}/manifest.json", manifest.model_dump_json().encode())
        filters.base, filters.unsaved = manifest, set()
        with self._held_lock:
            self._held[self.table_path] = filters
        replaced = {*(old.buckets.values() if old is not None else ()), *base.buckets.values()}
        for name in replaced - set(names.values()):
            self.store.delete(f"{self.key}/{name}")

    def _manifest(self) -> FilterManifest | None:
        return self._parsed(self.store.read(f"{self.key}/manifest.json"))

    @staticmethod
    def _parsed(raw: bytes | None) -> FilterManifest | None:
        try:
            return None if raw is None else FilterManifest.model_validate_json(raw)
        except ValueError:
            return None

    def _read(self, floor_bucket: int | None, table_id: str) -> IdFilters | None:
        manifest = self._manifest()
        with self._held_lock:
            held = self._held.pop(self.table_path, None)
        if manifest is None or manifest.scheme != SCHEME:
            return None
        if manifest.table_id != table_id or manifest.test_vector != hash_test_vector():
            return None  # another table's filters, or hashed otherwise: their bits answer for other IDs
        if not _covers(manifest.covered_from, floor_bucket):
            return None  # asked about older buckets than the filters kept (an older checkpoint's horizon)
        if held is not None and held.base == manifest and _covers(held.covered_from, floor_bucket):
            held.rebuilt, held.caught_up = False, 0
            return held  # descended from the saved manifest, and nobody saved since
        filters = IdFilters(version=manifest.version, table_id=table_id, covered_from=manifest.covered_from,
                            base=manifest)
        for bucket, name in manifest.buckets.items():
            if floor_bucket is not None and bucket < floor_bucket:
                continue
            data = self.store.read(f"{self.key}/{name}")
            if data is None or hashlib.sha256(data).hexdigest() != manifest.digests.get(bucket):
                return None  # missing, torn or altered: rebuild rather than trust part of a set
            try:
                filters.buckets[bucket] = BucketFilter.from_bytes(data)
            except ValueError:
                return None
        return filters

    def _rebuild(self, version: int, floor_bucket: int | None, table_id: str) -> IdFilters:
        where = None if floor_bucket is None else [(self.bucketing.partition, ">=", floor_bucket)]
        buckets = self._filled(version, where)
        log.info(f"{self.key}: ID filters rebuilt from the table at version {version} "
                 f"({sum(b.count for b in buckets.values())} IDs in {len(buckets)} buckets)")
        return IdFilters(version=version, table_id=table_id, buckets=buckets, covered_from=floor_bucket,
                         rebuilt=True, unsaved=set(buckets))

    def _filled(self, version: int, where: list | None) -> dict[int, BucketFilter]:
        """Filters filled from the table's rows at `version` (those matching `where`).

        Streamed a file at a time: memory holds one record batch's IDs beside the fingerprints, however many IDs
        the horizon holds."""
        dataset = table_snapshot(self.table_path, version=version).to_pyarrow_dataset()
        prints: dict[int, list[Fingerprints]] = {}
        for fragment in dataset.get_fragments(filter=None if where is None else pq.filters_to_expression(where)):
            keys = ds.get_partition_keys(fragment.partition_expression)
            for batch in fragment.to_batches(columns=["record_id", *self.bucketing.columns]):
                batch_prints, buckets = id_hashes(batch.column(0)), self.bucketing.of(batch, keys)
                for bucket in np.unique(buckets).tolist():
                    prints.setdefault(bucket, []).append(batch_prints.take(buckets == bucket))
        return {bucket: BucketFilter.of(Fingerprints.concat(parts)) for bucket, parts in prints.items()}


def _covers(covered_from: int | None, floor_bucket: int | None) -> bool:
    """Whether filters kept from bucket `covered_from` on answer for every bucket from `floor_bucket` on."""
    return covered_from is None or (floor_bucket is not None and floor_bucket >= covered_from)
