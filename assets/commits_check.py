"""The asset check `commits_not_quarantined`: fails while a commit sequence of the asset is quarantined.

A quarantined sequence is a publication that used up its attempts (see `onceflow.jobs.publish.commit_store`); the check
names it and its last error, and passes again once an operator re-armed it (`onceflow commits retry <id>`) and it
completed. `commit_sensor` reports this check whenever the set of quarantined sequences changes; it can also be
executed on its own. It fails with ERROR severity and is blocking: executed in a run, a failure fails the run.
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
    @dg.asset_check(
        asset=dg.AssetKey(asset),
        name=COMMITS_NOT_QUARANTINED,
        blocking=True,
        description="No publication (commit sequence) of this asset is quarantined after using up its attempts.",
    )
    def commits_not_quarantined(lake: LakeResource) -> dg.AssetCheckResult:
        evaluation = quarantine_evaluation(CommitStore(lake.commits()), asset)
        return dg.AssetCheckResult(
            passed=evaluation.passed, severity=evaluation.severity, metadata=evaluation.metadata
        )

    return commits_not_quarantined
