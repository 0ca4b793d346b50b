"""The shipped `orders` example end to end on Google's Pub/Sub emulator, through Dagster's command line."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from onceflow.jobs.windows.panes import Window
from onceflow.resources.emulators.pubsub import PubSubEmulator
from onceflow.resources.spark_connect import SparkConnectServer
from tests.delta_reader import read_rows
from tests.orders_data import make_orders, region_sales
from tests.pipelines import builtin, dagster_materialize, dagster_micro_batch, new_project, setup

FIVE_MIN = 300_000


def test_orders_from_pubsub_to_region_sales(
    spark_connect: SparkConnectServer, pubsub_emulator: PubSubEmulator, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = new_project()
    settings = {"pubsub_project": project, "watermark_idle_s": "2", "watermark_band_s": "1"}
    for name, value in settings.items():
        monkeypatch.setenv(f"ONCEFLOW_{name.upper()}", value)
    client, _ = setup(project, str(home), builtin("orders"))
    base = (int(time.time() * 1000) - 3_600_000) // FIVE_MIN * FIVE_MIN
    orders = make_orders(base, [7, 3, 5], seed=11)
    retries = orders[::4]  # publisher retries: new messages, same order_id attribute

    def message(order, rfc3339: bool) -> tuple[bytes, dict[str, str]]:
        stamp = datetime.fromtimestamp(order.ts_ms / 1000, UTC).isoformat() if rfc3339 else str(order.ts_ms)
        return order.body().encode(), {"order_id": order.order_id, "ts": stamp}

    client.publish("onceflow-orders", [message(o, i % 2 == 0) for i, o in enumerate(orders + retries)])
    client.publish("onceflow-orders", [(b'{"customer": "c1", "region": "eu"}', {"order_id": "bad", "ts": str(base)})])

    run = dagster_micro_batch(str(home), None, pipeline="orders")
    assert run.returncode == 0, run.stderr[-3000:]
    time.sleep(3)  # past the idle timeout: an idle batch moves the watermark to now, closing the windows
    run = dagster_micro_batch(str(home), None, pipeline="orders")
    assert run.returncode == 0, run.stderr[-3000:]
    windows = [Window(base + w * FIVE_MIN, base + (w + 1) * FIVE_MIN) for w in range(3)]
    run = dagster_materialize(str(home), f"{windows[0].key}...{windows[2].key}", asset="region_sales")
    assert run.returncode == 0, run.stderr[-3000:]

    expected = [
        (datetime.fromtimestamp(s / 1000, UTC), r, n, total, c, 1) for s, r, n, total, c in region_sales(orders)
    ]
    columns = ["window_start", "region", "orders", "revenue", "customers", "pane"]
    assert read_rows(str(home / "lake" / "windows" / "region_sales"), columns) == expected
    assert read_rows(str(home / "lake" / "dead_letter" / "orders"), ["record_id", "reason"]) == [
        ("bad", "missing_field")
    ]
    files = sorted((home / "published" / "region_sales").glob("window=*/pane=1/part-*.jsonl"))
    published = sorted(
        (r["region"], r["orders"], Decimal(r["revenue"])) for f in files for r in map(json.loads, f.read_text().splitlines())
    )
    assert published == sorted((r, n, total) for _, r, n, total, _ in region_sales(orders))
