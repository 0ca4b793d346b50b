"""User pipelines through Dagster's command line: DESIGN 6a's example end to end, two pipelines side by side.

The code location loads `tests.user_pipelines` (`ONCEFLOW_PIPELINES`); every run is `dagster job execute` or
`dagster asset materialize` in its own process; tables are read back with delta-rs, BigQuery from the emulator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest
from google.cloud import bigquery

from onceflow.jobs.windows.panes import Window
from onceflow.resources.spark_connect import SparkConnectServer
from tests.delta_reader import read_rows, transaction_version
from tests.orders_data import BAD_ORDERS, bad_lines, make_orders, region_sales, write_lines
from tests.pipelines import dagster_materialize, dagster_micro_batch

FIVE_MIN, HOUR, DAY = 300_000, 3_600_000, 86_400_000


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@pytest.fixture
def user_env(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, spark_connect: SparkConnectServer,
    bigquery_client: bigquery.Client,
) -> dict[str, str]:
    """The user's pipelines module, their data directories, a BigQuery dataset and a Dagster instance to keep."""
    dataset = bigquery_client.create_dataset(f"test_{uuid.uuid4().hex[:12]}").dataset_id
    settings = {
        "ONCEFLOW_PIPELINES": "tests.user_pipelines",
        "ORDERS_DIR": str(tmp_path / "orders"),
        "CLICKS_DIR": str(tmp_path / "clicks"),
        "ONCEFLOW_BIGQUERY_PROJECT": bigquery_client.project,
        "ONCEFLOW_BIGQUERY_DATASET": dataset,
        "ONCEFLOW_MAX_FILES": "1",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "dagster").mkdir()
    # Create the instance's storage now: two processes creating it at once race on its schema migration.
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster")):
        pass
    return {**settings, "dagster_home": str(tmp_path / "dagster")}


def materializations(dagster_home: str, asset: str) -> dict[str, dict]:
    """The newest materialization's metadata per partition, as the UI shows it."""
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        result = instance.fetch_materializations(dg.AssetKey(asset), limit=1000)
    latest: dict[str, dict] = {}
    for record in sorted(result.records, key=lambda r: r.storage_id):
        event = record.asset_materialization
        assert event is not None and event.partition is not None
        latest[event.partition] = {k: v.value for k, v in event.metadata.items()}
    return latest


def test_the_design_example_runs_end_to_end(user_env: dict[str, str], home: Path,
                                             bigquery_client: bigquery.Client) -> None:
    base = (int(time.time() * 1000) - 2 * HOUR) // FIVE_MIN * FIVE_MIN
    orders = make_orders(base, [6, 4, 9])
    retries = orders[1:3] + orders[12:13]  # a producer retrying: same order ids, a later file
    closers = make_orders(base + 4 * FIVE_MIN, [3], seed=9, prefix="late")  # moves the watermark past W0..W3
    directory = Path(user_env["ORDERS_DIR"])
    write_lines(directory / "a.jsonl", [o.json_line() for o in orders[:10]] + bad_lines(base + 1000))
    write_lines(directory / "b.jsonl", [o.json_line() for o in orders[10:] + retries + closers])
    dagster_home = user_env["dagster_home"]

    for _ in range(2):  # ONCEFLOW_MAX_FILES=1: one file per batch
        run = dagster_micro_batch(str(home), None, pipeline="orders", dagster_home=dagster_home)
        assert run.returncode == 0, run.stderr[-3000:]
    windows = [Window(base + w * FIVE_MIN, base + (w + 1) * FIVE_MIN) for w in range(3)]
    run = dagster_materialize(str(home), f"{windows[0].key}...{windows[2].key}", asset="region_sales",
                              dagster_home=dagster_home)
    assert run.returncode == 0, run.stderr[-3000:]

    # The window table equals the expected per-region results exactly: counts, decimal sums, distinct counts.
    expected = [(utc(s), r, n, total, c, 1, "on_time") for s, r, n, total, c in region_sales(orders)]
    lake = home / "lake"
    columns = ["window_start", "region", "orders", "revenue", "customers", "pane", "timing"]
    assert read_rows(str(lake / "windows" / "region_sales"), columns) == expected

    # Raw: typed columns per schema; the one dated 2199 did not make batch 2 a dead letter (the horizon floor
    # follows the watermark); fields outside the schema stay in the payload.
    raw = read_rows(str(lake / "raw" / "orders"), ["record_id", "customer", "region", "amount", "note", "payload"])
    unique = {o.order_id: o for o in orders + closers}
    assert [r[:5] for r in raw] == sorted(
        (o.order_id, o.customer, o.region, o.amount, o.note) for o in unique.values()
    )
    assert all(json.loads(r[5])["channel"] == "web" for r in raw)
    dead = {i: (r, d) for i, r, d in read_rows(str(lake / "dead_letter" / "orders"), ["record_id", "reason", "detail"])}
    assert len(dead) == len(BAD_ORDERS) + 1  # and the line that is not JSON, under its position
    assert [r for i, (r, _) in dead.items() if i.startswith("a.jsonl:")] == ["not_json"]
    for reason, named, fields in BAD_ORDERS:
        got_reason, detail = dead[fields["order_id"]]
        assert got_reason == reason and named in detail, (fields, got_reason, detail)

    # The raw asset's dead_letter_rate check, batch by batch: the first (7 bad lines of 17) fails, the second passes.
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        records = instance.get_event_records(dg.EventRecordsFilter(dg.DagsterEventType.ASSET_CHECK_EVALUATION))
    checks = [r.event_log_entry.dagster_event.event_specific_data for r in records]
    assert sorted((c.metadata["of"].value, c.check_name, c.passed, c.metadata["dead_lettered"].value,
                   c.metadata["received"].value) for c in checks if c.asset_key == dg.AssetKey("raw_orders")) == [
        ("batch 1", "dead_letter_rate", False, len(BAD_ORDERS) + 1, 10 + len(BAD_ORDERS) + 1),
        ("batch 2", "dead_letter_rate", True, 0, len(orders) - 10 + len(retries) + len(closers)),
    ]

    # Each partition of the backfill has its own figures, not the run's totals.
    per_window = {w.key: sum(1 for o in unique.values() if w.start_ms <= o.ts_ms < w.end_ms) for w in windows}
    assert len(set(per_window.values())) == 3
    metadata = materializations(dagster_home, "region_sales")
    assert {k: m["records"] for k, m in metadata.items()} == per_window
    assert {k: (m["pane"], m["timing"], m["published"]) for k, m in metadata.items()} == {
        w.key: (1, "on_time", "done") for w in windows
    }
    regions = {w.key: len({o.region for o in unique.values() if o.window_start == w.start_ms}) for w in windows}
    assert {k: m["keys"] for k, m in metadata.items()} == regions
    # Dagster's standard table metadata: the partition's rows, the table, its columns (the transform's and onceflow's).
    assert {k: m["dagster/row_count"] for k, m in metadata.items()} == regions
    first = next(iter(metadata.values()))
    assert first["dagster/uri"] == str(lake / "windows" / "region_sales")
    assert first["dagster/table_name"] == "windows/region_sales"
    columns = [c.name for c in first["dagster/column_schema"].columns]
    assert {"window_start", "region", "orders", "revenue", "customers", "pane"} <= set(columns)
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        raw_events = instance.fetch_materializations(dg.AssetKey("raw_orders"), limit=10).records
    newest = max(raw_events, key=lambda r: r.storage_id).asset_materialization
    assert newest is not None and newest.metadata["dagster/row_count"].value == len(unique)

    # Published exactly once to the file sink and BigQuery, with the output's own columns and types.
    files = sorted((home / "published" / "region_sales").glob("window=*/pane=1/part-*.jsonl"))
    published = sorted(
        (r["region"], r["orders"], Decimal(r["revenue"]), r["customers"])
        for f in files for r in map(json.loads, f.read_text().splitlines())
    )
    assert published == sorted((r, n, total, c) for _, r, n, total, c in region_sales(orders))
    sql = (f"SELECT region, orders, revenue, customers FROM "
           f"`{bigquery_client.project}.{user_env['ONCEFLOW_BIGQUERY_DATASET']}.region_sales`")
    assert sorted(tuple(row.values()) for row in bigquery_client.query_and_wait(sql)) == published


def clicks_workload(directory: Path) -> tuple[int, list[dict]]:
    """Clicks over yesterday (UTC) and one today, which moves the watermark past yesterday's end."""
    day = (int(time.time() * 1000) // DAY - 1) * DAY
    clicks = [
        {"click_id": f"k{i}", "at": day + (i % 5) * HOUR + i * 1000, "user": f"u{i % 4}", "page": f"/p{i % 3}",
         "ms": 10 * i, "tags": ["a", f"t{i % 2}"]}
        for i in range(30)
    ]
    # Today, at least a minute after midnight (the file watermark trails the newest record by 30 s).
    today = max(int(time.time() * 1000) - 60_000, day + DAY + 60_000)
    closer = {"click_id": "today", "at": today, "user": "u9", "page": "/p0", "ms": 1, "tags": []}
    write_lines(directory / "c.jsonl", [json.dumps(c) for c in [*clicks, clicks[0], closer]])
    return day, clicks


def test_two_pipelines_run_side_by_side(user_env: dict[str, str], home: Path) -> None:
    base = (int(time.time() * 1000) - 2 * HOUR) // FIVE_MIN * FIVE_MIN
    orders = make_orders(base, [5, 5])
    write_lines(Path(user_env["ORDERS_DIR"]) / "a.jsonl", [o.json_line() for o in orders])
    day, clicks = clicks_workload(Path(user_env["CLICKS_DIR"]))

    # Both micro-batches at once, each in its own `dagster job execute` process.
    command = [sys.executable, "-m", "dagster", "job", "execute", "-m", "onceflow.orchestration.definitions", "-j"]
    env = {**os.environ, "ONCEFLOW_HOME": str(home), "DAGSTER_HOME": user_env["dagster_home"]}
    runs = [subprocess.Popen([*command, f"ingest_{name}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for name in ("orders", "clicks")]
    for run in runs:
        output, _ = run.communicate(timeout=300)
        assert run.returncode == 0, output[-3000:]

    lake = home / "lake"
    assert transaction_version(str(lake / "raw" / "orders"), "orders/files") == 1
    assert transaction_version(str(lake / "raw" / "clicks"), "clicks/files") == 1
    assert len(read_rows(str(lake / "raw" / "orders"), ["record_id"])) == len(orders)
    raw_clicks = read_rows(str(lake / "raw" / "clicks"), ["record_id", "user", "page", "ms", "tags"])
    assert raw_clicks == sorted(
        [(c["click_id"], c["user"], c["page"], c["ms"], c["tags"]) for c in clicks] + [("today", "u9", "/p0", 1, [])]
    )
    assert {p.name for p in (home / "checkpoints").iterdir()} >= {"orders", "clicks"}

    hours = [Window(day + h * HOUR, day + (h + 1) * HOUR) for h in range(5)]
    run = dagster_materialize(str(home), f"{hours[0].key}...{hours[4].key}", asset="page_views",
                              dagster_home=user_env["dagster_home"])
    assert run.returncode == 0, run.stderr[-3000:]
    expected_views = sorted(
        (utc(w.start_ms), page, len(group), max(c["ms"] for c in group))
        for w in hours for page in {c["page"] for c in clicks}
        if (group := [c for c in clicks if c["page"] == page and w.start_ms <= c["at"] < w.end_ms])
    )
    columns = ["window_start", "page", "views", "slowest_ms"]
    assert read_rows(str(lake / "windows" / "page_views"), columns) == expected_views

    yesterday = Window(day, day + DAY)
    run = dagster_materialize(str(home), yesterday.key, asset="daily_users", dagster_home=user_env["dagster_home"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert read_rows(str(lake / "windows" / "daily_users"), ["window_start", "users", "clicks", "pane"]) == [
        (utc(day), 4, 30, 1)
    ]
    assert materializations(user_env["dagster_home"], "daily_users")[yesterday.key]["records"] == 30
