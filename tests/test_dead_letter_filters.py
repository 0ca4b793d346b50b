"""The dead-letter table's ID filters (bucketed by batch: the table has no time buckets) hold each bad record once,
whatever state they are in: deleted, restored from an older copy, or behind a DELETE of the table's rows. The
table is read back with delta-rs; its `record_id` column is never scanned to decide (that lookup raises here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.ingest import dead_letters
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.reader import open_source
from onceflow.resources.lake import LakeResource
from tests.delta_reader import read_rows
from tests.pipelines import builtin, events_from_files

START_MS = 1_763_720_000_000


def _bad(ids: list[str]) -> str:
    """Lines that parse, with an ID, whose value is no number: dead letters with those record IDs."""
    return "".join(json.dumps({"event_id": i, "event_time": START_MS, "key": "k", "value": "n/a"}) + "\n" for i in ids)


def _ids(prefix: str) -> list[str]:
    return [f"{prefix}{i}" for i in range(10)]


@pytest.mark.engine_paths
def test_dead_letters_are_held_once_through_their_filters(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = events_from_files(tmp_path, monkeypatch, max_files=1)

    def scanned(table: DeltaTable, ids: pa.Array) -> pa.Array:
        raise AssertionError("the dead-letter table was scanned: its filters did not answer")

    monkeypatch.setattr(dead_letters, "held_among", scanned)
    source = open_source(builtin("events"), LakeResource(home=str(home)))
    assert source.dead_letter_filters is not None
    saved = home / "filters" / "dead_letter" / "events"
    older = tmp_path / "dead-letter-filters-after-batch-0"
    x, y, z = _ids("x"), _ids("y"), _ids("z")
    batches = [
        x,  # all new
        [*x[:5], *y],  # five redelivered
        [*y[:5], *x[5:], *z],  # ten redelivered, found by filters restored from before batch 1 and caught up
        [x[0], x[1]],  # x0 was deleted from the table: inserted again, as the full MERGE would; x1 held
    ]
    results = []
    for k, ids in enumerate(batches):
        if k == 1:
            shutil.copytree(saved, older)
        if k == 2:
            shutil.rmtree(saved)
            shutil.copytree(older, saved)
            IdFilterStore.forget()  # a new process, which finds the older copy
        if k == 3:
            DeltaTable(source.dead_letter_path).delete("record_id = 'x0'")
        (incoming / f"{k}.jsonl").write_text(_bad(ids))
        results.append(run_micro_batch(lambda: spark, source))
        IdFilterStore.settle()

    assert [r.dead_lettered_total for r in results] == [10, 15, 20, 2]
    assert [r.dead_lettered_new for r in results] == [10, 10, 10, 1]
    assert all(r.balances() for r in results)
    held = read_rows(source.dead_letter_path, ["record_id", "batch_id"])
    assert sorted(held) == sorted([*((i, 1) for i in x[1:]), ("x0", 4), *((i, 2) for i in y), *((i, 3) for i in z)])
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["counts"] == {"0": 30}  # rebuilt after the DELETE (29 IDs), then x0 again
