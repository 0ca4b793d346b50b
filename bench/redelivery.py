"""What a batch of redelivered old records costs in the dedup lookup, as the raw table grows (docs/design.md section 10:
"flat for batches that redeliver records from anywhere in the horizon").

The lookup (`onceflow.jobs.dedup.id_filters.IdFilters.seen` of the batch's fingerprints, with their hashing) is
the one part of a batch whose cost depends on the table: reading, validating, writing and committing depend on
the batch. It is measured alone here, with delta-rs and no Spark, on raw-shaped tables (`record_id`, `time_bucket`) of `--redelivery-rows` rows (default
1,000,000 and 10,000,000), laid out as ingest lays them out: one commit (one file per bucket) per batch of 25,000
records, event times over 20 hours of one-hour buckets. Two kinds of IDs:

- `ordered`: IDs in the source's order, as Pub/Sub message IDs, Kafka offsets and file lines are;
- `random`: random UUIDs, as a producer that names its records may send.

Per table, the ID filters are rebuilt from it (timed apart, with the peak resident memory of the process: a rebuild
streams the table, so the peak grows only by the fingerprints themselves, 16 bytes an ID) and their one sorted run
made, as a process's first batch makes it beside its commit (timed apart: `index_s`); then two redeliveries of `REPLAY` old records
are looked up, each timed over `ROUNDS` repetitions (median; the first one, which reads each file's footer, is
discarded) beside as many fresh IDs: `seek`, the records of a stretch of time hours back (a subscription seek, a producer replaying an
hour: consecutive records), and `scattered`, records drawn from anywhere in the horizon. Every lookup must find
every redelivered ID and nothing else. `ratio` is the largest table's median over the smallest's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from bench.datasets import BenchmarkError
from bench.memory import PeakRss
from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.dedup.fingerprints import id_hashes
from onceflow.resources.object_store import open_store

SIZES = (1_000_000, 10_000_000)
BATCH = 25_000
HOURS = 20
REPLAY = 2_500
ROUNDS = 5
LAYOUTS = ("ordered", "random")
KINDS = ("seek", "scattered")


def load(path: str, rows: int, layout: str) -> list[str]:
    """The table, a batch per commit in event-time order; its IDs in that order."""
    ids: list[str] = []
    first_bucket = 490_000
    for start in range(0, rows, BATCH):
        n = min(BATCH, rows - start)
        batch = ([f"{10**15 + start + i}" for i in range(n)] if layout == "ordered"
                 else [str(uuid.uuid4()) for _ in range(n)])
        buckets = first_bucket + (np.arange(start, start + n) * HOURS // rows)
        write_deltalake(path, pa.table({"record_id": batch, "time_bucket": pa.array(buckets, pa.int64())}),
                        partition_by=["time_bucket"], mode="append")
        ids += batch
    return ids


def replays(ids: list[str], seed: int = 3) -> dict[str, list[str]]:
    """`seek`: consecutive records from about the middle of the horizon; `scattered`: drawn from all of it."""
    middle = len(ids) // 2
    return {"seek": ids[middle : middle + REPLAY], "scattered": random.Random(seed).sample(ids, REPLAY)}


def measure(work: Path, rows: int, layout: str, rounds: int) -> dict[str, Any]:
    path = str(work / f"raw-{layout}-{rows}")
    start = time.perf_counter()
    ids = load(path, rows, layout)
    load_s = time.perf_counter() - start
    began = time.perf_counter()
    with PeakRss() as rss:
        filters = IdFilterStore(open_store(str(work / f"filters-{layout}-{rows}")), "raw", path).load(None)
    result: dict[str, Any] = {"load_s": load_s, "rebuild_s": time.perf_counter() - began,
                              "rebuild_rss_before_bytes": rss.before, "rebuild_peak_rss_bytes": rss.peak}
    began = time.perf_counter()
    filters.index()  # as a process's first batch's upkeep makes it
    result["index_s"] = time.perf_counter() - began
    print(f"redelivery {layout} {rows:,} rows: filters rebuilt in {result['rebuild_s']:.1f} s, peak RSS "
          f"{rss.peak / 2**20:,.0f} MiB (before {rss.before / 2**20:,.0f} MiB); their one sorted run made in "
          f"{result['index_s']:.2f} s", flush=True)
    for kind, old in replays(ids).items():
        fresh = [f"fresh-{i}" for i in range(REPLAY)]
        asked, seconds = pa.array(old + fresh), []
        for _ in range(rounds + 1):
            began = time.perf_counter()
            seen = filters.seen(id_hashes(asked))
            seconds.append(time.perf_counter() - began)
            if seen.tolist() != [True] * len(old) + [False] * len(fresh):
                raise BenchmarkError(f"redelivery {layout} {rows} {kind}: found {seen[:len(old)].sum()} of "
                                     f"{len(old)} old IDs and {seen[len(old):].sum()} of the fresh ones")
        result[kind] = {"median_s": statistics.median(seconds[1:]), "seconds": seconds[1:]}
        print(f"redelivery {layout} {rows:,} rows, {kind}: {result[kind]['median_s'] * 1000:.1f} ms median",
              flush=True)
    return result


def redelivery(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-ready result (see the module docstring)."""
    sizes: tuple[int, ...] = getattr(args, "redelivery_rows", None) or SIZES
    rounds: int = getattr(args, "redelivery_rounds", None) or ROUNDS
    measured: dict[str, dict[str, Any]] = {layout: {} for layout in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-redelivery-") as tmp:
        for layout in LAYOUTS:
            for rows in sizes:
                measured[layout][str(rows)] = measure(Path(tmp), rows, layout, rounds)
    small, large = str(sizes[0]), str(sizes[-1])
    return {
        "sizes": measured,
        "ratio": {layout: {kind: measured[layout][large][kind]["median_s"] / measured[layout][small][kind]["median_s"]
                           for kind in KINDS} for layout in LAYOUTS} if len(sizes) > 1 else None,
        "ratio_sizes": [sizes[0], sizes[-1]],
        "config": {"batch_rows": BATCH, "hours": HOURS, "replayed": REPLAY, "fresh_alongside": REPLAY,
                   "rounds": rounds,
                   "timed": "id_hashes + IdFilters.seen of the redelivered and as many fresh IDs"},
    }
