"""A quarantined commit sequence is an ERROR a Dagster alert can route: the blocking check `commits_not_quarantined`,
executed in a run on a real instance, fails with ERROR severity and fails its run (what a run failure sensor sees)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from onceflow.assets.commits_check import COMMITS_NOT_QUARANTINED, build_commits_check
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.resources.lake import LakeResource
from tests.test_commit_store import SEQ, record

ASSET = "event_counts"  # SEQ's asset


def run_check(lake: LakeResource, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    check = build_commits_check(ASSET)
    defs = dg.Definitions(
        assets=[dg.AssetSpec(ASSET)], asset_checks=[check], resources={"lake": lake},
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
