"""The ingest run's side of record outputs: after each raw commit, stage the batch for every record output and
drive its commit sequence at once (`onceflow.jobs.publish.record_sequence`); each publication is a materialization
of the output's asset, and an evaluation of its check `sinks_hold_batches`.

A sequence this run cannot finish (a sink down) stays pending: the commit sensor's finalize runs retry it, within
its attempts, and the run goes on with the next batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg
from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.record_output import RecordOutput, close_sinks
from onceflow.jobs.delta.commit_log import committed_batch
from onceflow.jobs.publish.commit_records import PENDING, unavailable_wait_s
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_sequence import (
    RawBatches,
    batch_of,
    stage_through,
    staged_rows,
    start_output,
)
from onceflow.jobs.publish.sequence import CommitResult, run_sequence, sequence_asset
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.resources.lake import LakeResource

SINKS_HOLD_BATCHES = "sinks_hold_batches"


def records_behind(source: SourceRuntime, store: CommitStore) -> bool:
    """Whether a record output of the source's pipeline has not staged every batch its raw table holds of the
    source's epoch: what `RecordPublisher.catch_up` then stages, so that asking again finds nothing behind."""
    if not source.pipeline.record_outputs:
        return False
    held = committed_batch(source.raw_path, source.app_id)
    marks = [store.published_through(o.asset) for o in source.pipeline.record_outputs]
    return held is not None and any(mark is not None and mark < held for mark in marks)


def record_outputs_of(pipelines: Sequence[Pipeline]) -> dict[str, RecordOutput]:
    """Every record output of the code location, by asset: what finalize runs find sinks in."""
    return {o.asset: o for p in pipelines for o in p.record_outputs}


@dataclass(frozen=True)
class Publication:
    """One batch's publication to one record output, as this run drove it."""

    output: RecordOutput
    sequence_id: str
    batch: int
    rows: int
    result: CommitResult
    ms: float

    @property
    def held(self) -> bool:
        return self.result.outcome in ("done", "already_done")


class RecordPublisher:
    """Publishes a source's record outputs as run `run_id` (of the lineage `root_run_id`) commits its batches."""

    def __init__(self, source: SourceRuntime, lake: LakeResource, run: tuple[str, str]) -> None:
        self.outputs = source.pipeline.record_outputs
        self.ctx = CommitContext(CommitStore(lake.commits()), records={o.asset: o for o in self.outputs})
        self.staging = lake.staging_root()
        self.raw = RawBatches(source.pipeline, source.raw_path, source.app_id, source.epoch)
        self.run_id, self.root_run_id = run
        self._deferred: dict[str, list[tuple[str, int, int]]] = {}  # by output: staged, not yet tried, in order
        for output in self.outputs:
            start_output(self.ctx.store, output, self.raw, source.checkpoints.first_batch)

    def catch_up(self, get_spark: Callable[[], SparkSession]) -> list[Publication]:
        """Stage and drive the batches the raw table holds that an output has not staged: a run that died between
        a raw commit and staging left them, and with no new data no next commit would."""
        held = committed_batch(self.raw.raw_path, self.raw.app_id)
        if held is None or all((self.ctx.store.published_through(o.asset) or 0) >= held for o in self.outputs):
            return []
        return self.publish(get_spark, held)

    def publish(self, get_spark: Callable[[], SparkSession], batch: int, version: int | None = None) -> list[Publication]:
        """Stage and drive every record output's batches through `batch` (committed as table version `version`,
        when known).

        Once a publication finds a sink unreachable, the output's later batches are staged (written ahead) but not
        tried until that one's wait (`unavailable_wait_s`) is over: each try of a silent sink costs its client's
        timeout, which the next batch would otherwise wait for. They are tried in order when it is, by this run or
        by the commit sensor's finalize runs, whichever comes first.
        """
        done = []
        for output in self.outputs:
            queue = self._deferred.pop(output.asset, [])
            queue += stage_through(get_spark(), self.ctx.store, self.staging, output, self.raw, batch, version)
            while queue:
                seq, number, rows = queue[0]
                state = self.ctx.store.state(seq)
                if state.status != PENDING:  # a finalize run finished it (or it is quarantined): not this run's
                    queue.pop(0)
                    continue
                if unavailable_wait_s(state) > 0:
                    break  # the sink was unreachable moments ago: not again yet
                began = time.monotonic()
                outcome = run_sequence(self.ctx, seq, self.run_id, self.root_run_id)
                done.append(Publication(output, seq, number, rows, outcome, (time.monotonic() - began) * 1000))
                if outcome.outcome == "failed" and self.ctx.store.state(seq).unavailable_streak:
                    break  # the batches after it wait for the sink too
                queue.pop(0)
            if queue:
                self._deferred[output.asset] = queue
        return done

    def close(self) -> None:
        close_sinks(self.outputs)


def record_publication(
    store: CommitStore, records: Mapping[str, RecordOutput], result: CommitResult, ms: float
) -> Publication | None:
    """The publication a finalize run's `result` finished, None when it is not a record output's or not done now."""
    asset = sequence_asset(result.sequence_id)
    record = store.get(result.sequence_id)
    if asset not in records or result.outcome != "done" or record is None:
        return None
    return Publication(records[asset], result.sequence_id, batch_of(result.sequence_id), staged_rows(record), result, ms)


def publication_events(publication: Publication) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """A publication as its output's materialization (when every sink holds it) and its check's evaluation."""
    key = dg.AssetKey(publication.output.asset)
    metadata = {
        "batch_id": publication.batch, "rows": publication.rows, "commit_sequence": publication.sequence_id,
        "outcome": publication.result.outcome, "publish_ms": round(publication.ms, 1),
        "sinks": [sink.name for sink in publication.output.sinks],
    }
    check = dg.AssetCheckEvaluation(
        asset_key=key, check_name=SINKS_HOLD_BATCHES, passed=publication.held, metadata=metadata,
        description=None if publication.held else f"not yet in every sink: {publication.result.error}",
    )
    if not publication.held:
        return [check]
    return [dg.AssetMaterialization(asset_key=key, metadata=metadata), check]
