"""The whole code location loads, with the names users and tests script against, for the built-in pipelines."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from onceflow.orchestration.definitions import definitions
from onceflow.resources.spark_connect import SparkConnectServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def defs(spark_connect: SparkConnectServer, home: Path) -> dg.Definitions:
    return definitions()


def test_definitions_have_the_reference_pipeline(defs: dg.Definitions, home: Path) -> None:
    job = defs.get_job_def("ingest_events")
    assert [node.name for node in job.nodes] == ["micro_batch_events"]
    assert job.tags["onceflow/source"] == "events/pubsub"

    counts = defs.get_assets_def("event_counts")
    partitions = counts.partitions_def
    assert isinstance(partitions, dg.TimeWindowPartitionsDefinition)
    assert partitions.fmt == "%Y-%m-%d-%H:%M" and partitions.timezone == "UTC"
    # A fixed start (the pipeline's start_date), not one that moves with the clock.
    assert partitions.get_first_partition_key() == "2026-11-01-00:00"
    keys = partitions.get_partition_keys_in_range(dg.PartitionKeyRange("2026-11-01-00:00", "2026-11-01-00:02"))
    assert keys == ["2026-11-01-00:00", "2026-11-01-00:01", "2026-11-01-00:02"]
    assert counts.backfill_policy == dg.BackfillPolicy.single_run()
    assert {c.name for c in counts.check_specs} == {
        "counts_match_raw",
        "late_records_accounted",
        "no_duplicate_record_ids",
    }
    assert dg.AssetKey("raw_events") in counts.dependency_keys
    # The raw table as Dagster's catalog shows any table: where it is, its name, its columns.
    raw = next(spec for spec in defs.assets if isinstance(spec, dg.AssetSpec) and spec.key.path == ["raw_events"])
    assert raw.metadata["dagster/uri"] == str(home / "lake" / "raw" / "events")
    assert raw.metadata["dagster/table_name"] == "raw/events"
    columns = [(c.name, c.type) for c in raw.metadata["dagster/column_schema"].columns]
    assert columns[:2] == [("record_id", "string"), ("event_time", "timestamp")] and ("batch_id", "bigint") in columns


def test_definitions_have_the_orders_example_beside_events(defs: dg.Definitions) -> None:
    assert defs.get_job_def("ingest_orders").tags["onceflow/source"] == "orders/pubsub"
    sales = defs.get_assets_def("region_sales")
    partitions = sales.partitions_def
    assert isinstance(partitions, dg.TimeWindowPartitionsDefinition)
    keys = partitions.get_partition_keys_in_range(dg.PartitionKeyRange("2026-11-01-00:00", "2026-11-01-00:10"))
    assert keys == ["2026-11-01-00:00", "2026-11-01-00:05", "2026-11-01-00:10"]
    assert dg.AssetKey("raw_orders") in sales.dependency_keys
    # No Dagster pool on a source's runs: they take turns (onceflow.jobs.run_relay), so the next one starts warm.
    assert {defs.get_job_def(f"ingest_{name}").nodes[0].definition.pool for name in ("events", "orders")} == {None}


def test_definitions_have_the_sensors_the_finalize_job_and_the_quarantine_checks(defs: dg.Definitions) -> None:
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {
        "events_micro_batch_sensor", "event_counts_window_sensor",
        "orders_micro_batch_sensor", "region_sales_window_sensor",
        "commit_sensor", "dead_run_sensor",
    }
    assert all(s.default_status == dg.DefaultSensorStatus.RUNNING for s in sensors.values())
    assert sensors["events_micro_batch_sensor"].job_name == "ingest_events"
    assert sensors["orders_micro_batch_sensor"].job_name == "ingest_orders"
    finalize = defs.get_job_def("finalize_commits")
    assert [node.name for node in finalize.nodes] == ["finalize_sequence"]
    check_keys = {key for checks in defs.asset_checks for key in checks.check_keys}
    for asset in ("event_counts", "region_sales"):
        assert dg.AssetCheckKey(dg.AssetKey(asset), "commits_not_quarantined") in check_keys


def test_workspace_validates(spark_connect: SparkConnectServer, home: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Validation successful" in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("module", "settings", "message"),
    [
        (
            "import dataclasses\nfrom tests.user_pipelines import *\n"
            "out = dataclasses.replace(orders.outputs[0], keys=['area'])\n"
            "PIPELINES = [dataclasses.replace(orders, outputs=[out])]\n",
            {},
            "pipeline 'orders': output 'region_sales': key 'area' is not a column of the transform's output "
            "(region, orders, revenue, customers)",
        ),
        (
            "import dataclasses\nfrom tests.user_pipelines import *\n"
            "out = dataclasses.replace(orders.outputs[0], transform=lambda r: r.groupBy('regoin').count())\n"
            "PIPELINES = [dataclasses.replace(orders, outputs=[out])]\n",
            {},
            "pipeline 'orders': output 'region_sales': the transform fails on the declared schema",
        ),
        ("from tests.user_pipelines import *\n", {"ONCEFLOW_MAX_MESSAGES": "-5"}, "ONCEFLOW_MAX_MESSAGES='-5'"),
    ],
)
def test_a_bad_declaration_or_setting_fails_the_code_location_load(
    spark_connect: SparkConnectServer, home: Path, tmp_path: Path, module: str, settings: dict[str, str], message: str
) -> None:
    (tmp_path / "my_pipelines.py").write_text(module)
    env = {
        **os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}", "ONCEFLOW_PIPELINES": "my_pipelines",
        "ONCEFLOW_BIGQUERY_DATASET": "sales", **settings,
    }
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "onceflow.orchestration.definitions"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert message in result.stderr + result.stdout, (result.stderr + result.stdout)[-3000:]


def test_each_window_asset_has_a_freshness_policy_of_window_lateness_watermark_and_slack(defs: dg.Definitions) -> None:
    """The daemon (`freshness: enabled` in dagster.yaml) fails an asset not materialized within the window, its
    allowed lateness, the watermark's band and idle time (defaults 10 s and 120 s) and 5 minutes."""
    expected = {
        "event_counts": timedelta(seconds=60 + 30 + 10 + 120, minutes=5),  # the settings' 1-minute windows
        "region_sales": timedelta(minutes=5 + 1 + 5, seconds=10 + 120),  # 5-minute windows, 1 minute late
    }
    for asset, deadline in expected.items():
        policy = defs.get_assets_def(asset).specs_by_key[dg.AssetKey(asset)].freshness_policy
        assert isinstance(policy, dg.FreshnessPolicy)
        assert (policy.fail_window.to_timedelta(), policy.warn_window) == (deadline, None)
    assert defs.resolve_assets_def("raw_events").specs_by_key[dg.AssetKey("raw_events")].freshness_policy is None


def test_the_window_assets_checks_are_blocking(defs: dg.Definitions) -> None:
    """A check failing with ERROR severity fails its run, which a run failure sensor routes to an alert."""
    for asset in ("event_counts", "region_sales"):
        specs = {spec.name: spec.blocking for spec in defs.get_assets_def(asset).check_specs}
        assert specs == {"counts_match_raw": True, "late_records_accounted": True, "no_duplicate_record_ids": True}
