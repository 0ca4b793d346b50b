"""`PostgresSink` on a real PostgreSQL, through real commit sequences (no Spark): a server down for longer than
the attempt budget, then back; a connection the server drops between two attempts; upsert where a late retry of
an older batch loses to a newer one; columns added as the output gains them, a changed type refused by name."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import dagster as dg
import psycopg
import pyarrow as pa
import pytest

from onceflow import PostgresSink, RecordOutput
from onceflow.jobs.publish.commit_records import DONE, PENDING, UNAVAILABLE_MAX_WAIT_S, unavailable_wait_s
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import run_sequence
from onceflow.jobs.publish.step import CommitContext
from onceflow.resources.emulators.postgres import PostgresServer
from onceflow.resources.emulators.pubsub import free_port
from onceflow.resources.object_store import open_store
from tests.postgres import fresh_database, postgres  # noqa: F401 - a fixture
from tests.test_sinks import staged_sequence


def orders(ids: list[str], total: str, batch: int) -> pa.Table:
    return pa.table({
        "record_id": ids, "event_time": pa.array([datetime(2026, 12, 1, tzinfo=UTC)] * len(ids), pa.timestamp("us", "UTC")),
        "order_id": ids, "total": pa.array([Decimal(total)] * len(ids), pa.decimal128(10, 2)),
        "batch_seen": [batch] * len(ids)})


def context(store: CommitStore, mode: str = "upsert") -> tuple[CommitContext, PostgresSink]:
    """A context as a new run makes one: its sink connects on first use, with `ORDERS_DSN` as it is then."""
    sink = PostgresSink(dsn=dg.EnvVar("ORDERS_DSN"), table="shop.orders", mode=mode, key=["order_id"])  # type: ignore[arg-type]
    return CommitContext(store, records={"orders_copy": RecordOutput(asset="orders_copy", sinks=[sink])}), sink


@pytest.fixture
def dsn(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    database = fresh_database(postgres)
    url = f"postgresql://{database.user}:{database.password}@{database.host}:{database.port}/{database.database}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE SCHEMA shop")
    monkeypatch.setenv("ORDERS_DSN", url)
    return url


def test_a_server_down_past_the_budget_then_back_gets_each_batch_once(
    tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CommitStore(open_store(f"{tmp_path}/commits"))
    seq = staged_sequence(tmp_path, store, orders(["o1", "o2"], "1.50", 1), "postgres:shop.orders", 1)
    monkeypatch.setenv("ORDERS_DSN", f"postgresql://nobody@127.0.0.1:{free_port()}/none")  # nothing listens
    for attempt in range(7):  # more attempts than the budget of 5
        result = run_sequence(context(store)[0], seq, f"down-{attempt}")
        assert result.outcome == "failed" and "ConnectionError: PostgreSQL (shop.orders)" in (result.error or "")
    state = store.state(seq)
    assert (state.status, state.attempts_used, state.unavailable_streak) == (PENDING, 0, 7)
    assert unavailable_wait_s(state, now_ms=max(a.finished_at_ms or 0 for a in state.attempts)) == UNAVAILABLE_MAX_WAIT_S

    monkeypatch.setenv("ORDERS_DSN", dsn)  # the server is back
    ctx, sink = context(store)
    assert run_sequence(ctx, seq, "back").outcome == "done"
    # The server drops the sink's connection (a restart): the next batch's attempt fails unreachable, the one
    # after it reconnects.
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                      "'onceflow-sink' AND datname = current_database()")
    second = staged_sequence(tmp_path, store, orders(["o3"], "2.00", 2), "postgres:shop.orders", 2)
    first_try = run_sequence(ctx, second, "dropped")
    assert first_try.outcome == "failed" and "ConnectionError" in (first_try.error or "")
    assert run_sequence(ctx, second, "reconnected").outcome == "done"
    sink.close()
    with psycopg.connect(dsn) as connection:
        rows = connection.execute("SELECT order_id, total FROM shop.orders ORDER BY order_id").fetchall()
        markers = connection.execute("SELECT commit_id, rows FROM shop.onceflow_commits ORDER BY commit_id").fetchall()
    assert rows == [("o1", Decimal("1.50")), ("o2", Decimal("1.50")), ("o3", Decimal("2.00"))]
    assert markers == [("orders/orders_copy/0/1", 2), ("orders/orders_copy/0/2", 1)]
    assert {store.state(s).status for s in (seq, second)} == {DONE}


def test_upsert_keeps_the_newest_batch_adds_columns_and_refuses_a_changed_type(tmp_path: Path, dsn: str) -> None:
    store = CommitStore(open_store(f"{tmp_path}/commits"))
    ctx, sink = context(store)
    newer = staged_sequence(tmp_path, store, orders(["o1", "o2"], "9.00", 2), "postgres:shop.orders", 2)
    older = staged_sequence(tmp_path, store, orders(["o1", "o3"], "1.00", 1), "postgres:shop.orders", 1)
    assert run_sequence(ctx, newer, "run-1").outcome == "done"
    assert run_sequence(ctx, older, "run-2").outcome == "done"  # batch 1 retried late: o1 stays batch 2's
    wider = orders(["o4"], "4.00", 3).append_column("note", pa.array(["gift"]))
    assert run_sequence(ctx, staged_sequence(tmp_path, store, wider, sink.name, 3), "run-3").outcome == "done"
    changed = pa.table({"record_id": ["o5"], "order_id": ["o5"], "total": ["five"]})
    refused = run_sequence(ctx, staged_sequence(tmp_path, store, changed, sink.name, 4), "run-4")
    assert refused.outcome == "failed"
    assert ("PostgresSchemaError: shop.orders: total is numeric(10,2), the output gives text (columns are only "
            "ever added)") in (refused.error or "")
    sink.close()
    with psycopg.connect(dsn) as connection:
        rows = connection.execute("SELECT order_id, total, batch_seen, onceflow_batch, note FROM shop.orders "
                                  "ORDER BY order_id").fetchall()
    assert rows == [("o1", Decimal("9.00"), 2, 2, None), ("o2", Decimal("9.00"), 2, 2, None),
                    ("o3", Decimal("1.00"), 1, 1, None), ("o4", Decimal("4.00"), 3, 3, "gift")]
