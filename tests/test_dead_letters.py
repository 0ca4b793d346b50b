"""Dead letters appended by delta-rs from the driver (`onceflow.jobs.ingest.dead_letters`): once per batch, on the
table version their IDs were looked up in, each ID held once. The table is read back with delta-rs; no Spark."""

from __future__ import annotations

import json
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
