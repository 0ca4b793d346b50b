"""A quarantined commit sequence is an ERROR a Dagster alert can route: the blocking check `commits_not_quarantined`,
executed in a run on a real instance, fails with ERROR severity and fails its run (what a run failure sensor sees)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from onceflow.assets.commits_check import COMMITS_NOT_QUARANTINED, build_commits_check
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.windows.panes import PARTITION_FORMAT
from onceflow.orchestration.deployments import LAKE
from onceflow.resources.lake import LakeResource
from tests.test_commit_store import SEQ, record

ASSET = "event_counts"  # SEQ's asset


def run_check(lake: LakeResource, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    check = build_commits_check(ASSET)
    defs = dg.Definitions(
        assets=[dg.AssetSpec(ASSET)], asset_checks=[check], resources={LAKE: lake},
        jobs=[dg.define_asset_job("check_commits", selection=dg.AssetSelection.checks(check))],
    )
    return defs.resolve_job_def("check_commits").execute_in_process(instance=instance, raise_on_error=False)


def test_a_quarantined_sequence_fails_the_check_with_error_severity_and_its_run(home: Path) -> None:
    lake = LakeResource(home=str(home))
    store = CommitStore(lake.commits())
    with dg.instance_for_test() as instance:
        passing = run_check(lake, instance)
        assert passing.success
        assert [(e.passed, e.severity) for e in passing.get_asset_check_evaluations()] == [
            (True, dg.AssetCheckSeverity.ERROR)
        ]

        store.write_sequence(record())
        store.quarantine(SEQ, "bad data, investigating")
        failing = run_check(lake, instance)

        assert not failing.success
        [evaluation] = failing.get_asset_check_evaluations()
        assert (evaluation.check_name, evaluation.passed, evaluation.severity, evaluation.blocking) == (
            COMMITS_NOT_QUARANTINED, False, dg.AssetCheckSeverity.ERROR, True
        )
        assert evaluation.metadata["quarantined_sequences"].value == [SEQ]
        assert evaluation.metadata[f"reason {SEQ}"].value == "bad data, investigating"
        [failure] = [e for e in failing.all_events if e.is_step_failure]
        error = failure.step_failure_data.error
        assert error is not None and error.cls_name == "DagsterAssetCheckFailedError"
        assert f"{ASSET}: {COMMITS_NOT_QUARANTINED}" in error.message
        run = instance.get_run_by_id(failing.run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE


def test_a_range_run_of_an_old_partitioned_asset_never_lists_its_partitions_and_checks_after_the_asset(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check takes nothing of its asset: a run over five windows of an asset whose windows started a year ago
    never lists the asset's partition keys (with the asset as an input, Dagster listed all 500,000 of them to look
    up the evaluation's target), and the check still runs after the asset's step."""
    partitions = dg.TimeWindowPartitionsDefinition(
        start="2025-11-01-00:00", fmt=PARTITION_FORMAT, cron_schedule="* * * * *", timezone="UTC", end_offset=1
    )
    listed: list[str] = []

    def list_every_key(partitions_def: dg.TimeWindowPartitionsDefinition, *args: object, **kwargs: object) -> None:
        listed.append(partitions_def.start.isoformat())
        raise RuntimeError("listed every partition key of the asset")  # at once: a real listing takes minutes

    monkeypatch.setattr(dg.TimeWindowPartitionsDefinition, "get_partition_keys", list_every_key)

    @dg.asset(key=ASSET, partitions_def=partitions, backfill_policy=dg.BackfillPolicy.single_run())
    def windows() -> None:
        return None

    first, last = "2025-11-01-00:00", "2025-11-01-00:04"
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [windows, build_commits_check(ASSET)], instance=instance, resources={LAKE: LakeResource(home=str(home))},
            raise_on_error=False,
            tags={ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last},
        )

    assert listed == []
    assert result.success
    assert [(e.check_name, e.passed) for e in result.get_asset_check_evaluations()] == [(COMMITS_NOT_QUARANTINED, True)]
    assert sorted(m.partition for m in result.asset_materializations_for_node("event_counts")) == [
        f"2025-11-01-00:0{i}" for i in range(5)
    ]
    started = [e.step_key for e in result.all_events if e.is_step_start]
    assert started == ["event_counts", f"event_counts_{COMMITS_NOT_QUARANTINED}"]
