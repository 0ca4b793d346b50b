"""Dead letters appended by delta-rs from the driver (`onceflow.jobs.ingest.dead_letters`): once per batch, on the
table version their IDs were looked up in, each ID held once. The table is read back with delta-rs; no Spark."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake.exceptions import CommitFailedError

from onceflow.jobs.delta.arrow_append import append_arrow_once
from onceflow.jobs.delta.commit_log import rows_appended
from onceflow.jobs.delta.raw_table import DEAD_LETTER_SCHEMA
from onceflow.jobs.delta.transactions import create_table_once, table_properties
from onceflow.jobs.ingest.dead_letters import held_among
from onceflow.resources.delta_storage import delta_table

WHEN = datetime(2026, 11, 25, 12, tzinfo=UTC)


def _dead(ids: list[str], batch: int) -> pa.Table:
    n = len(ids)
    return pa.table({
        "source_position": [f"f:{i}" for i in range(n)], "raw": ["{"] * n, "reason": ["not_json"] * n,
        "detail": ["not JSON"] * n, "record_id": ids, "event_time": pa.array([None] * n, pa.timestamp("us", "UTC")),
        "batch_id": pa.array([batch] * n, pa.int64()), "ingested_at": pa.array([WHEN] * n, pa.timestamp("us", "UTC")),
    })


def _meta(batch: int) -> dict:
    return {"onceflow_source": "p/s", "onceflow_batch": batch}


def test_dead_letters_commit_once_and_never_on_a_table_that_moved_since_their_lookup(tmp_path: Path) -> None:
    path = str(tmp_path / "dead_letters")
    create_table_once(path, DEAD_LETTER_SCHEMA, table_properties(3600))
    looked_up = delta_table(path)  # batch 2 decides against version 0 ...

    assert append_arrow_once(delta_table(path), _dead(["a", "b"], 1), "p/s", 1, _meta(1))
    assert not append_arrow_once(delta_table(path), _dead(["a", "b"], 1), "p/s", 1, _meta(1))  # a replay
    with pytest.raises(CommitFailedError):  # ... and batch 1 committed since: decided again, never rebased
        append_arrow_once(looked_up, _dead(["a"], 2), "p/s", 2, _meta(2))

    table = delta_table(path)
    assert held_among(table, pa.array(["a", "c", "a"])).to_pylist() == ["a"]
    assert sorted(table.to_pyarrow_table(columns=["record_id", "batch_id"]).to_pylist(),
                  key=lambda r: r["record_id"]) == [{"record_id": "a", "batch_id": 1}, {"record_id": "b", "batch_id": 1}]
    assert table.transaction_version("p/s") == 1
    commit = table.history(1)[0]  # what a replay reports as the batch's, and what `verify` adds up
    assert rows_appended(commit["operationMetrics"]) == 2
    assert json.loads(commit["userMetadata"]) == _meta(1)


def test_appends_clean_the_log_only_with_a_checkpoint(tmp_path: Path) -> None:
    """delta-rs would list the whole log after every commit to clean it (a cost growing with the log); onceflow's
    appends have it removed entries past the table's retention only in a commit that writes a checkpoint (every 10
    commits), as Spark's Delta does."""
    path, log = str(tmp_path / "dead_letters"), tmp_path / "dead_letters" / "_delta_log"
    create_table_once(path, DEAD_LETTER_SCHEMA, table_properties(3600))
    batch = 0

    def append() -> int:
        nonlocal batch
        batch += 1
        assert append_arrow_once(delta_table(path), _dead([f"r{batch}"], batch), "p/s", batch, _meta(batch))
        return delta_table(path).version()

    while append() < 12:
        pass
    aged = time.time() - 2 * 86400  # the entries so far are past the table's hour of retention
    for entry in log.iterdir():
        os.utime(entry, (aged, aged))
    while (version := append()) % 10 != 9:  # delta-rs checkpoints versions 9, 19, ...
        assert (log / f"{0:020d}.json").exists(), version  # no checkpoint, no cleaning
    assert version == 19 and (log / f"{version:020d}.checkpoint.parquet").exists()
    # Past the retention and before the checkpoint a reader of a kept version starts from (9): removed.
    assert sorted(entry.name[:20] for entry in log.iterdir() if entry.name[:20].isdigit()) == [
        f"{v:020d}" for v in (9, *range(9, 20), 19)]
    table = delta_table(path)
    assert sorted(table.to_pyarrow_table(columns=["record_id"])["record_id"].to_pylist()) == sorted(
        f"r{b}" for b in range(1, batch + 1))
    assert table.transaction_version("p/s") == batch
