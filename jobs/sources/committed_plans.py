"""What a source's batches were, as the lake holds it: every Delta commit of a batch carries the batch's plan.

A checkpoint restored from an old copy loses plans; the lake keeps them. `CommittedPlans` reads a committed batch's
plan from the checkpoints, else from its commit in the raw or dead-letter table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from onceflow.jobs.delta.commit_log import committed_metadata
from onceflow.jobs.sources.checkpoint import BatchPlan, CheckpointStore

PLAN_KEY = "onceflow_plan"
"""The key of a batch's plan in its commits' `userMetadata`."""


@dataclass(frozen=True)
class CommittedPlans:
    """The plans of one source's batches (its `app_id`), from `checkpoints` or from the commits to its tables."""

    checkpoints: CheckpointStore
    app_id: str
    raw_path: str
    dead_letter_path: str

    def metadatas(self, batches: Iterable[int]) -> dict[int, dict]:
        """What the commits of `batches` carried, by batch, from the raw and dead-letter tables' logs."""
        wanted, found = list(batches), {}
        for path in (self.raw_path, self.dead_letter_path):
            found = committed_metadata(path, self.app_id, [b for b in wanted if b not in found]) | found
        return found

    def plan_in(self, metadata: dict) -> BatchPlan | None:
        """The plan a batch's Delta commit carried (read like a stored one: an older format is upgraded)."""
        if PLAN_KEY not in metadata:
            return None
        where = (f"the Delta commit of {self.app_id} batch {metadata.get('onceflow_batch')} (userMetadata "
                 f"{PLAN_KEY}) in {self.raw_path} or {self.dead_letter_path}")
        return BatchPlan.load(metadata[PLAN_KEY], where)

    def plan_of(self, batch: int) -> BatchPlan | None:
        """A committed batch's plan: from the checkpoints, else as its commit carried it; None when neither
        holds it."""
        return self.checkpoints.get_plan(batch) or self.plan_in(self.metadatas([batch]).get(batch, {}))
