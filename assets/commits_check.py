"""The asset check `commits_not_quarantined`: fails while a commit sequence of the asset is quarantined.

A quarantined sequence is a publication that used up its attempts (see `onceflow.jobs.publish.commit_store`); the check
names it and its last error, and passes again once an operator re-armed it (`onceflow commits retry <id>`) and it
completed. `commit_sensor` reports this check whenever the set of quarantined sequences changes; it can also be
executed on its own. It fails with ERROR severity and is blocking: executed in a run, a failure fails the run.

The check reads nothing of its asset, so its op does not take the asset as an input. An input would cost a
backfill run (a partition range) a listing of every window partition since the pipeline's start: for an
unpartitioned check of a partitioned input, Dagster maps the input to all partitions and lists their keys to look
up the evaluation's target materialization (4.8 s of CPU at 40,000 one-minute windows, growing with the
pipeline's age). Without the input, a low step priority still runs it after the window step in the same run.
"""

from typing import Any

import dagster as dg

from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import sequence_asset
from onceflow.resources.lake import LakeResource

COMMITS_NOT_QUARANTINED = "commits_not_quarantined"


def quarantined_of(store: CommitStore, asset: str) -> list[str]:
    """Quarantined sequence ids of `asset`, sorted."""
    return [s for s in store.quarantined() if sequence_asset(s) == asset]


def quarantine_evaluation(store: CommitStore, asset: str) -> dg.AssetCheckEvaluation:
    quarantined = quarantined_of(store, asset)
    metadata: dict[str, Any] = {"quarantined_sequences": quarantined, "quarantined": len(quarantined)}
    for seq in quarantined[:10]:
        metadata[f"reason {seq}"] = store.state(seq).quarantine_reason or ""
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(asset),
        check_name=COMMITS_NOT_QUARANTINED,
        passed=not quarantined,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
        description=None if not quarantined else "re-arm with `onceflow commits retry <sequence id>`",
    )


def build_commits_check(asset: str) -> dg.AssetChecksDefinition:
    spec = dg.AssetCheckSpec(
        COMMITS_NOT_QUARANTINED,
        asset=dg.AssetKey(asset),
        blocking=True,
        description="No publication (commit sequence) of this asset is quarantined after using up its attempts.",
    )

    @dg.op(
        name=f"{dg.AssetKey(asset).to_python_identifier()}_{COMMITS_NOT_QUARANTINED}",
        out={COMMITS_NOT_QUARANTINED: dg.Out(dg.Nothing)},
        # After the other steps of a run (the window step, whose publishing can quarantine a sequence).
        tags={"dagster/priority": "-1"},
    )
    def commits_not_quarantined(onceflow_lake: LakeResource) -> dg.AssetCheckResult:
        evaluation = quarantine_evaluation(CommitStore(onceflow_lake.commits()), asset)
        return dg.AssetCheckResult(
            passed=evaluation.passed, severity=evaluation.severity, metadata=evaluation.metadata
        )

    return dg.AssetChecksDefinition.create(
        keys_by_input_name={},
        node_def=commits_not_quarantined,
        check_specs_by_output_name={COMMITS_NOT_QUARANTINED: spec},
        can_subset=False,
    )
