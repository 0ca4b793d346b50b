"""The whole code location loads, with the names users and tests script against."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg

from orchestration.definitions import defs

ROOT = Path(__file__).resolve().parent.parent


def test_definitions_have_the_reference_pipeline() -> None:
    job = defs.get_job_def("ingest_events")
    assert [node.name for node in job.nodes] == ["micro_batch_events"]
    assert job.tags["onceflow/source"] == "events/pubsub"

    counts = defs.get_assets_def("event_counts")
    partitions = counts.partitions_def
    assert isinstance(partitions, dg.TimeWindowPartitionsDefinition)
    assert partitions.fmt == "%Y-%m-%d-%H:%M" and partitions.timezone == "UTC"
    assert partitions.get_partition_keys_in_range(
        dg.PartitionKeyRange(partitions.get_first_partition_key(), partitions.get_last_partition_key())
    )[:2] == [partitions.get_first_partition_key(), partitions.get_partition_key_for_timestamp(
        partitions.start.timestamp() + 60
    )]
    assert len(partitions.get_partition_keys()) < 100_000
    assert counts.backfill_policy == dg.BackfillPolicy.single_run()
    assert {c.name for c in counts.check_specs} == {
        "counts_match_raw",
        "late_records_accounted",
        "no_duplicate_record_ids",
    }
    assert dg.AssetKey("raw_events") in counts.dependency_keys


def test_definitions_have_the_sensors_the_finalize_job_and_the_quarantine_check() -> None:
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {"events_micro_batch_sensor", "event_counts_window_sensor", "commit_sensor"}
    assert all(s.default_status == dg.DefaultSensorStatus.RUNNING for s in sensors.values())
    assert sensors["events_micro_batch_sensor"].job_name == "ingest_events"
    finalize = defs.get_job_def("finalize_commits")
    assert [node.name for node in finalize.nodes] == ["finalize_sequence"]
    check_keys = {key for checks in defs.asset_checks for key in checks.check_keys}
    assert dg.AssetCheckKey(dg.AssetKey("event_counts"), "commits_not_quarantined") in check_keys


def test_workspace_validates() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Validation successful" in result.stderr + result.stdout
