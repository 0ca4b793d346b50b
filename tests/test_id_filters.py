"""The dedup fast path: the fingerprints of committed IDs never change what lands, whatever state they are in.

Each test ingests file batches whose records repeat records of earlier batches, with the filters deleted, restored
from an older copy, altered, or with rows deleted from the table between batches, and checks the raw table (read
with delta-rs) holds what the full MERGE would have left: every record exactly once.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import SparkSession

from onceflow.jobs.dedup import filter_store as id_filter_store
from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.dedup.fingerprints import id_hashes
from onceflow.jobs.dedup.id_filters import BucketFilter
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.workload import Event, expected_raw, make_events
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import builtin, events_from_files

RAW = ["record_id", "event_time", "key", "value"]
START_MS = 1_763_720_000_000
HOUR_MS = 3_600_000


@pytest.fixture
def incoming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return events_from_files(tmp_path, monkeypatch, max_files=1)


def _write(directory: Path, name: str, events: list[Event]) -> None:
    (directory / name).write_text("".join(f"{e.json_line()}\n" for e in events))


def _ingest_in_batches(
    spark: SparkSession, incoming: Path, source: SourceRuntime, between: Callable[[int], None]
) -> tuple[list[Event], list]:
    """Four batches of 200 events over three hours; batches 2-4 each repeat 30 records of every earlier batch.
    `between(k)` runs before batch k, once the filters of the batch before are saved or held."""
    events, results = _events(), []
    for k in range(4):
        fresh = events[200 * k : 200 * (k + 1)]
        repeats = [e for j in range(k) for e in events[200 * j : 200 * j + 30]]
        _write(incoming, f"{k}.jsonl", fresh + repeats)
        IdFilterStore.settle()
        between(k)
        results.append(run_micro_batch(lambda: spark, source))
    return events, results


def _events() -> list[Event]:
    return make_events(800, START_MS, 3 * 3600_000, seed=5, prefix="b")


def _source(home: Path) -> SourceRuntime:
    source = open_source(builtin("events"), LakeResource(home=str(home)))
    assert source.id_filters is not None
    return source


def _check(source: SourceRuntime, events: list[Event], results: list) -> None:
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert [r.inserted for r in results] == [200, 200, 200, 200]
    assert [r.duplicates_committed for r in results] == [0, 30, 60, 90]
    assert all(r.balances() for r in results)


def test_the_fast_path_proves_fresh_records_new_and_finds_the_repeats(
    spark: SparkSession, incoming: Path, home: Path
) -> None:
    source = _source(home)
    events, results = _ingest_in_batches(spark, incoming, source, lambda k: None)
    _check(source, events, results)
    stats = [r.fast_path for r in results]
    # Every repeat is found committed and every fresh record proven new, with no read of the table.
    assert [s["committed_found"] for s in stats] == [0, 30, 60, 90]
    assert [s["proven_new"] for s in stats] == [200, 200, 200, 200]
    assert not any(s["filters_rebuilt"] for s in stats[1:])


def test_deleted_filters_are_rebuilt_from_the_table(spark: SparkSession, incoming: Path, home: Path) -> None:
    source = _source(home)

    def delete(k: int) -> None:
        if k in (2, 3):
            shutil.rmtree(home / "filters")

    events, results = _ingest_in_batches(spark, incoming, source, delete)
    _check(source, events, results)
    assert [r.fast_path["filters_rebuilt"] for r in results][2:] == [True, True]


def test_filters_restored_from_an_older_copy_catch_up_from_the_delta_log(
    spark: SparkSession, incoming: Path, home: Path
) -> None:
    source = _source(home)
    backup = home.parent / "filters-after-batch-1"

    def restore(k: int) -> None:
        if k == 1:
            shutil.copytree(home / "filters", backup)
        if k == 3:
            shutil.rmtree(home / "filters")
            shutil.copytree(backup, home / "filters")
            IdFilterStore.forget()  # as in a new process that finds the older copy

    events, results = _ingest_in_batches(spark, incoming, source, restore)
    _check(source, events, results)
    assert results[3].fast_path["filters_caught_up_commits"] == 2  # batches 2 and 3, read from the log
    assert not results[3].fast_path["filters_rebuilt"]


def test_altered_filters_are_rebuilt_and_rows_deleted_from_the_table_leave_them(
    spark: SparkSession, incoming: Path, home: Path
) -> None:
    """Filters altered behind the manifest's back are never trusted. Rows deleted from the table (here before batch
    3, which repeats them) leave the filters as they leave the table: the full MERGE would insert their records
    again, and so does the fast path."""
    from deltalake import DeltaTable

    source = _source(home)
    deleted: list[str] = []

    def damage(k: int) -> None:
        if k == 2:  # every fingerprint cleared, the manifest's digests left as they were
            _rewrite_buckets(home, np.zeros_like, sign=False)
            IdFilterStore.forget()  # as in a new process: this one would reuse the filters it holds
        if k == 3:  # this process's filters are current: the delete reaches them only through the log
            deleted.extend(e.event_id for e in _events()[:10])  # batch 0's, repeated by batch 3
            DeltaTable(source.raw_path).delete(f"record_id IN ({', '.join(repr(i) for i in deleted)})")

    events, results = _ingest_in_batches(spark, incoming, source, damage)
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    again = len(deleted)
    assert [r.inserted for r in results] == [200, 200, 200, 200 + again]
    assert [r.duplicates_committed for r in results] == [0, 30, 60, 90 - again]
    assert results[2].fast_path["filters_rebuilt"] is True and not results[3].fast_path["filters_rebuilt"]
    assert all(r.balances() for r in results)


@pytest.mark.parametrize(("field", "value"), [("table_id", "another-table"), ("test_vector", [1, 2, 3])])
def test_filters_of_another_table_or_another_hash_are_rebuilt(
    spark: SparkSession, incoming: Path, home: Path, field: str, value: object
) -> None:
    """Saved filters that describe another Delta table (one re-created at the same path), or whose test vector
    another hash implementation made, are rebuilt: here they are empty and signed as sound, so trusted they would
    take every repeat for a fresh record."""
    source = _source(home)

    def foreign(k: int) -> None:
        if k == 2:
            _rewrite_buckets(home, np.zeros_like, sign=True)
            (manifest_path,) = (home / "filters").rglob("manifest.json")
            manifest_path.write_text(json.dumps({**_saved_manifest(home), field: value}))
            IdFilterStore.forget()  # as in a new process

    events, results = _ingest_in_batches(spark, incoming, source, foreign)
    _check(source, events, results)
    assert results[2].fast_path["filters_rebuilt"] is True


def test_buckets_changed_only_by_catching_up_are_saved_too(
    spark: SparkSession, incoming: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saves are deferred, so a process often starts from filters some commits behind. Those commits' IDs are
    caught up into buckets the batch itself may not touch; saving must write those buckets too, or a later reader
    of the saved filters would take a repeat of them for a fresh record."""
    monkeypatch.setattr(id_filter_store, "SAVE_EVERY_VERSIONS", 2)
    source = _source(home)
    hour = (START_MS // HOUR_MS + 1) * HOUR_MS
    first_hour = make_events(400, hour, HOUR_MS // 2, seed=7, prefix="a")
    third_hour = make_events(200, hour + 2 * HOUR_MS, HOUR_MS // 2, seed=8, prefix="c")
    batches = [first_hour[:200], first_hour[200:], third_hour[:100], [*third_hour[100:], *first_hour[200:230]]]
    results, saved_versions = [], []
    for k, events in enumerate(batches):
        if k in (2, 3):
            IdFilterStore.forget()  # a new process
        _write(incoming, f"{k}.jsonl", events)
        results.append(run_micro_batch(lambda: spark, source))
        saved_versions.append(_saved_manifest(home)["version"])

    raw_versions = [r.raw_version for r in results]
    # Saved when built (batch 0), then not until 2 versions past that; batch 3 starts from batch 2's save.
    assert saved_versions == [raw_versions[0], raw_versions[0], raw_versions[2], raw_versions[2]]
    assert results[2].fast_path["filters_caught_up_commits"] == 1  # batch 1, all in the first hour's bucket
    assert read_rows(source.raw_path, RAW) == expected_raw([*first_hour, *third_hour])
    assert [r.inserted for r in results] == [200, 200, 100, 100]
    assert [r.duplicates_committed for r in results] == [0, 0, 0, 30]
    assert results[3].fast_path["committed_found"] == 30 and not results[3].fast_path["filters_caught_up_commits"]


def _saved_manifest(home: Path) -> dict:
    IdFilterStore.settle()  # the last batch's filters are saved beside what follows it
    (manifest_path,) = (home / "filters").rglob("manifest.json")
    return json.loads(manifest_path.read_text())


def _rewrite_buckets(home: Path, change: Callable[[np.ndarray], np.ndarray], sign: bool) -> None:
    """Change every bucket filter's bits; `sign` also records the new bytes in the manifest (a filter that really
    is that way), else the manifest still names the old bytes (a file altered behind its back)."""
    (manifest_path,) = (home / "filters").rglob("manifest.json")
    manifest = _saved_manifest(home)
    for bucket, name in manifest["buckets"].items():
        path = manifest_path.parent / name
        data = change(np.frombuffer(path.read_bytes(), dtype=np.uint64)).tobytes()
        path.write_bytes(data)
        if sign:
            manifest["digests"][bucket] = hashlib.sha256(data).hexdigest()
    if sign:
        manifest_path.write_text(json.dumps(manifest))


def test_fingerprints_find_exactly_the_committed_ids(tmp_path: Path) -> None:
    """Filled from a table (IDs past Delta's 32-character statistics prefix, characters above U+FFFF), saved and
    read back, the fingerprints find every committed ID in whichever bucket it was committed, and no other;
    IDs sharing a fingerprint's first half are told apart by the second."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from onceflow.jobs.dedup.fingerprints import Fingerprints
    from onceflow.resources.object_store import open_store

    path = str(tmp_path / "raw")
    tail = "/projects/p/subscriptions/s/" + "x" * 8
    ids = [f"{k:02d}{tail}-{i:03d}" for k in range(12) for i in range(40)] + [f"{tail}\U0001f600{i}" for i in range(9)]
    rows = pa.table({"record_id": ids, "time_bucket": pa.array([i % 3 for i in range(len(ids))], pa.int64())})
    write_deltalake(path, rows, partition_by=["time_bucket"])
    store = IdFilterStore(open_store(str(tmp_path / "filters")), "raw", path)
    built = store.load(None)
    store.save(built)
    IdFilterStore.forget()
    for filters in (built, store.load(None)):
        assert sorted(filters.buckets) == [0, 1, 2] and sum(b.count for b in filters.buckets.values()) == len(ids)
        never = [f"01{tail}-zzz", f"{tail}\U0001f601", "", "00"]
        for asked in (ids[::-7], ids[::-1]):
            seen = filters.seen(id_hashes(pa.array(never[:2] + asked + never[2:])))
            assert seen.tolist() == [False] * 2 + [True] * len(asked) + [False] * 2

    bucket = BucketFilter.of(Fingerprints(np.array([5, 5, 5, 7], np.uint64), np.array([1, 2, 3, 4], np.uint64)))
    asked = Fingerprints(np.array([5, 5, 5, 5, 7, 7, 6], np.uint64), np.array([3, 2, 1, 9, 4, 1, 1], np.uint64))
    assert bucket.contains(asked).tolist() == [True, True, True, False, True, False, False]
    assert BucketFilter.from_bytes(bucket.to_bytes()).contains(asked).tolist() == bucket.contains(asked).tolist()


def test_a_search_through_a_runs_directory_lands_where_a_binary_search_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first position at or after each key, in runs of many repeats and none, short and long, packed in one
    block of the directory or spread over all 64 bits, for keys before, among, between and after the run's."""
    from onceflow.jobs.dedup import id_filters

    monkeypatch.setattr(id_filters, "_DIRECTORY_FROM", 0)
    rng = np.random.default_rng(3)
    for size in (1, 2, 3, 4, 5, 63, 64, 65, 1000, 4097):
        for spread in (3, 10**6, 2**64 - 1):
            low, high = min(10, 2**64 - 1 - spread), min(20 + spread, 2**64 - 1)
            first = np.sort(rng.integers(low, low + spread, size, dtype=np.uint64, endpoint=True))
            keys = np.sort(np.concatenate([first[rng.integers(0, size, 50)],
                                           rng.integers(0, high, 50, dtype=np.uint64, endpoint=True)]))
            keys = np.concatenate([np.array([0], np.uint64), keys, np.array([2**64 - 1], np.uint64)])
            found = id_filters._first_at_least(first, keys, id_filters._directory(first))
            assert found.tolist() == np.searchsorted(first, keys).tolist(), (size, spread)


@pytest.mark.parametrize("directory", [False, True], ids=["binary search", "through a directory"])
def test_filters_answer_for_every_id_added_as_they_are_added_dropped_and_refilled(
    directory: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filters' one sorted run of every bucket (and its recent additions, kept apart until they are a sixteenth
    of it) answers as the buckets searched one by one do: checked against the IDs themselves through adds, drops below the horizon and
    a refilled bucket, asking for IDs held, IDs gone and IDs never added, many sharing a first half. Runs are
    searched as big ones are too, through a directory of their first halves' leading bits, when `directory`."""
    from onceflow.jobs.dedup import id_filters
    from onceflow.jobs.dedup.fingerprints import Fingerprints
    from onceflow.jobs.dedup.id_filters import IdFilters

    if directory:
        monkeypatch.setattr(id_filters, "_DIRECTORY_FROM", 0)

    rng = np.random.default_rng(7)
    filters, held, gone = IdFilters(version=0), {}, set()  # held: fingerprint -> bucket, the model

    def prints(n: int) -> Fingerprints:
        return Fingerprints(rng.integers(0, 5000, n).astype(np.uint64), rng.integers(0, 2**63, n, dtype=np.uint64))

    def of(pairs: list[tuple[int, int]]) -> Fingerprints:
        return Fingerprints(*(np.array(half, np.uint64) for half in zip(*pairs, strict=True)))

    def add(new: Fingerprints, buckets: np.ndarray) -> None:
        filters.add(new, buckets)
        held.update({(int(a), int(b)): int(k) for a, b, k in zip(new.first, new.second, buckets, strict=True)})

    def drop(kept: Callable[[tuple[int, int], int], bool]) -> None:
        nonlocal held
        gone.update(p for p, k in held.items() if not kept(p, k))
        held = {p: k for p, k in held.items() if kept(p, k)}

    def ask() -> None:
        asked = Fingerprints.concat([prints(40), of(list(held)[-60:]), *([of(sorted(gone)[:60])] if gone else [])])
        want = [(int(a), int(b)) in held for a, b in zip(asked.first, asked.second, strict=True)]
        assert filters.seen(asked).tolist() == want

    add(prints(3000), rng.integers(0, 10, 3000))
    ask()  # bucket by bucket
    filters.index()  # as a batch's upkeep makes it; kept up to date after
    for step in range(40):
        new = prints(int(rng.integers(1, 60)))
        add(new, rng.integers(step // 4, step // 4 + 10, len(new)))
        if step % 7 == 6:
            filters.drop_below(step // 4)
            drop(lambda p, k, floor=step // 4: k >= floor)
        if step == 20:
            kept = sorted(p for p, k in held.items() if k == 9 and p[1] % 2)
            filters.refill(9, BucketFilter.of(of(kept)))
            drop(lambda p, k, kept=set(kept): k != 9 or p in kept)
            ask()
            filters.index()
        ask()
    assert sum(f.count for f in filters.buckets.values()) == len(held)
