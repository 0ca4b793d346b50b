"""`BigQuerySink` for record outputs on the BigQuery emulator (no Spark): a writer killed between its load and its
transaction, then the commit written by the next writer once; two writers of one commit at once; every type the
sink maps read back by the BigQuery client; columns added, a changed type refused through a commit sequence."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from google.cloud import bigquery

from onceflow import BigQuerySink, Commit, RecordOutput
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import run_sequence
from onceflow.jobs.publish.step import CommitContext
from onceflow.resources.emulators.bigquery import BigQueryEmulator
from onceflow.resources.object_store import open_store
from tests.test_sinks import staged_sequence

WRITER = textwrap.dedent("""
    import sys
    import pyarrow as pa
    from onceflow import BigQuerySink, Commit
    sink = BigQuerySink(table="orders", dataset=sys.argv[1], project=sys.argv[2], api_endpoint=sys.argv[3])
    sink.write(pa.table({"record_id": ["a", "b"], "total": [1, 2]}), Commit("orders", "orders_out", 0, 1))
""")


@pytest.fixture
def dataset(bigquery_client: bigquery.Client, tmp_path: Path) -> str:
    name = f"records_{tmp_path.name[-8:].replace('-', '_')}"
    bigquery_client.create_dataset(f"{bigquery_client.project}.{name}")
    return name


def sink_of(emulator: BigQueryEmulator, dataset: str) -> BigQuerySink:
    return BigQuerySink(table="orders", dataset=dataset, project=emulator.project, api_endpoint=emulator.endpoint)


def rows_of(client: bigquery.Client, table: str, columns: str = "record_id, total") -> list[tuple]:
    return sorted(tuple(row.values()) for row in client.query_and_wait(f"SELECT {columns} FROM `{table}`"))


def test_a_writer_killed_before_its_transaction_leaves_the_commit_to_the_next_once(
    tmp_path: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, dataset: str
) -> None:
    env = {**os.environ, "ONCEFLOW_HOME": str(tmp_path), "ONCEFLOW_CRASH_AT": "sink.bigquery.before_commit"}
    killed = subprocess.run([sys.executable, "-c", WRITER, dataset, bigquery_emulator.project,
                             bigquery_emulator.endpoint], env=env, capture_output=True, text=True, timeout=300)
    assert "crash injected at sink.bigquery.before_commit" in killed.stderr, killed.stderr[-3000:]
    table = f"{bigquery_emulator.project}.{dataset}.orders"
    staged = [t.table_id for t in bigquery_client.list_tables(f"{bigquery_emulator.project}.{dataset}")]
    assert any(t.startswith("orders__onceflow_rows_") for t in staged), staged  # loaded, not inserted
    assert rows_of(bigquery_client, table) == []

    sink, commit = sink_of(bigquery_emulator, dataset), Commit("orders", "orders_out", 0, 1)
    assert not sink.committed(commit) and sink.rows(commit) is None
    rows = pa.table({"record_id": ["a", "b"], "total": [1, 2]})
    sink.write(rows, commit)  # the killed writer's load job found by its id, then the transaction
    sink.write(rows, commit)  # committed already: nothing runs
    assert sink.committed(commit) and sink.rows(commit) == 2
    # Two writers of a new commit at once: one runs each job, the other finds it by its id.
    second = Commit("orders", "orders_out", 0, 2)
    more = pa.table({"record_id": ["c"], "total": [3]})
    writers = [threading.Thread(target=s.write, args=(more, second))
               for s in (sink_of(bigquery_emulator, dataset), sink_of(bigquery_emulator, dataset))]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert rows_of(bigquery_client, table) == [("a", 1), ("b", 2), ("c", 3)]
    markers = rows_of(bigquery_client, f"{bigquery_emulator.project}.{dataset}.onceflow_commits", "commit_id, rows")
    assert markers == [("orders/orders_out/0/1", 2), ("orders/orders_out/0/2", 1)]
    tables = {t.table_id for t in bigquery_client.list_tables(f"{bigquery_emulator.project}.{dataset}")}
    assert tables == {"orders", "onceflow_commits"}  # every staging table dropped


def test_types_read_back_columns_added_and_a_changed_type_refused(
    tmp_path: Path, bigquery_emulator: BigQueryEmulator, bigquery_client: bigquery.Client, dataset: str
) -> None:
    sink = sink_of(bigquery_emulator, dataset)
    store = CommitStore(open_store(f"{tmp_path}/commits"))
    ctx = CommitContext(store, records={"orders_copy": RecordOutput(asset="orders_copy", sinks=[sink])})
    when = datetime(2026, 12, 1, 8, 5, 3, 123456, tzinfo=UTC)
    typed = pa.table({
        "record_id": ["a", "b"], "total": pa.array([Decimal("1.50"), None], pa.decimal128(10, 2)),
        "event_time": pa.array([when, when], pa.timestamp("us", "UTC")), "day": [date(2026, 12, 1), None],
        "paid": [True, False], "qty": pa.array([3, None], pa.int32()), "tags": [["x", "y"], []],
        "address": [{"city": "Oslo", "zip": 150}, None], "blob": [b"\x00\x01", None], "ratio": [0.25, None],
    })
    assert run_sequence(ctx, staged_sequence(tmp_path, store, typed, sink.name, 1), "run-1").outcome == "done"
    found = {row["record_id"]: dict(row) for row in bigquery_client.query_and_wait(
        f"SELECT * FROM `{bigquery_emulator.project}.{dataset}.orders`")}
    assert found["a"] == {"record_id": "a", "total": Decimal("1.50"), "event_time": when, "day": date(2026, 12, 1),
                          "paid": True, "qty": 3, "tags": ["x", "y"], "address": {"city": "Oslo", "zip": 150},
                          "blob": b"\x00\x01", "ratio": 0.25}
    assert (found["b"]["total"], found["b"]["day"], found["b"]["tags"], found["b"]["address"]) == (None, None, [], None)

    wider = pa.table({"record_id": ["c"], "total": pa.array([Decimal("2.00")], pa.decimal128(10, 2)),
                      "note": ["gift"]})
    assert run_sequence(ctx, staged_sequence(tmp_path, store, wider, sink.name, 2), "run-2").outcome == "done"
    assert rows_of(bigquery_client, f"{bigquery_emulator.project}.{dataset}.orders", "record_id, note") == [
        ("a", None), ("b", None), ("c", "gift")]
    changed = pa.table({"record_id": ["d"], "total": ["five"]})
    refused = run_sequence(ctx, staged_sequence(tmp_path, store, changed, sink.name, 3), "run-3")
    assert refused.outcome == "failed"
    assert "BigQueryTypeChanged" in (refused.error or "") and "column 'total' is NUMERIC" in (refused.error or "")
    assert sink.rows(Commit("orders", "orders_copy", 0, 2)) == 1 and sink.rows(Commit("orders", "orders_copy", 0, 3)) is None
