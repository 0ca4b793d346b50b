"""Versioned stored state: a home written by the onceflow before formats had versions (commit 7acc293) loads, and a
document from a newer onceflow fails with a typed error naming where it lives.

The previous format is written here as the exact bytes that onceflow wrote (JSON literals, not old code): the
dataclasses serialized with `json.dumps(asdict(...), sort_keys=True)`, the epoch record unsorted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from onceflow.jobs.declare.declaration import FileSink, FileSource, Pipeline, WindowedOutput
from onceflow.jobs.publish.commit_records import FAILED, PENDING, Attempt, SequenceRecord
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.sources.checkpoint import BatchPlan, CheckpointStore, EpochStore
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.jobs.windows.panes import CloseStore, PaneClose, Window
from onceflow.orchestration.pipelines import resolve
from onceflow.orchestration.pipelines.events import SCHEMA, event_counts
from onceflow.resources.files import FileEntry
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings
from onceflow.resources.stored import InvalidStoredState, UnknownStateVersion

T = 1_700_000_000_000  # a minute boundary
SEQ = "event_counts:2023-11-14-22:13:pane-1"
SHA_A, SHA_B = "a" * 64, "b" * 64

# Exactly what onceflow 7acc293 wrote, key by key (`<app>` is the source's app id in epoch 1).
EPOCH_V0 = b'{"epoch": 1, "first_batches": [1, 3], "at_ms": 1700000000500}'
CHECKPOINT_V0 = (
    b'{"committed_batch": 4, "max_event_time_ms": 1700000190000, "min_event_time_ms": 1700000005000, '
    b'"recent_batches": [[3, 1700000005000], [4, 1700000030000]], "taken_files": {"a.jsonl": {"path": "a.jsonl", '
    b'"sha256": "' + SHA_A.encode() + b'", "size": 120}}, "totals": {"inserted": 9, "received": 10}, '
    b'"updated_at_ms": 1700000200000, "watermark": {"watermark_ms": 1700000151000}}'
)
PLAN_V0 = (
    b'{"batch_id": 5, "files": [{"path": "b.jsonl", "sha256": "' + SHA_B.encode() + b'", "size": 64}], '
    b'"horizon_floor_ms": null, "kind": "files", "landing_key": null, "planned_at_ms": 1700000100000}'
)
CLOSE_V0 = (
    b'{"closed_at_ms": 1700000160000, "max_batch_id": 4, "pane": 1, "raw_version": 7, "timing": "on_time", '
    b'"watermark_ms": 1700000151000, "window_start_ms": 1700000000000}'
)
SEQUENCE_V0 = (
    b'{"created_at_ms": 1700000161000, "id": "' + SEQ.encode() + b'", "max_attempts": 5, "steps": [{"asset": '
    b'"event_counts", "kind": "high_watermark", "published_through_ms": 1700000060000}]}'
)
STATE_V0 = (
    b'{"attempts": [{"error": "boom", "finished_at_ms": 1700000163000, "number": 1, "outcome": "failed", '
    b'"root_run_id": "r1", "run_id": "r1", "started_at_ms": 1700000162000}], "budget_from": 0, "history": [], '
    b'"last_error": "boom", "max_attempts": 5, "quarantine_reason": null, "sequence_id": "' + SEQ.encode() + b'", '
    b'"status": "pending", "steps": ["pending"], "updated_at_ms": 1700000163000}'
)


def files_pipeline(directory: Path) -> Pipeline:
    output = WindowedOutput(asset="event_counts", window="1m", allowed_lateness="30s", keys=["key"],
                            transform=event_counts, sinks=[FileSink()])
    source = FileSource(directory=str(directory), id_field="event_id", timestamp_field="event_time")
    return resolve(Pipeline(name="events", source=source, schema=SCHEMA, outputs=[output]), load_settings())


def previous_home(lake: LakeResource, pipeline: Pipeline) -> str:
    """Write a home's stores as onceflow 7acc293 wrote them; return the source's app id."""
    app = f"{pipeline.source_id}@1"
    lake.epochs().write("events.json", EPOCH_V0)
    lake.checkpoints().write(f"{app}/checkpoint.json", CHECKPOINT_V0)
    lake.checkpoints().write(f"{app}/batches/000000000005.json", PLAN_V0)
    lake.panes().write(f"event_counts/closes/{T:015d}/pane-0001.json", CLOSE_V0)
    lake.commits().write(f"sequences/{SEQ}.json", SEQUENCE_V0)
    lake.commits().write(f"state/{SEQ}/0000000002.json", STATE_V0)
    return app


def test_a_home_written_in_the_previous_format_loads_and_carries_on(tmp_path: Path, home: Path) -> None:
    lake = LakeResource(home=str(home))
    pipeline = files_pipeline(tmp_path / "in")
    app = previous_home(lake, pipeline)

    epochs = EpochStore(lake.epochs())
    assert (epochs.current("events"), epochs.first_batches("events")) == (1, [1, 3])
    source = open_source(pipeline, lake)
    assert (source.app_id, source.checkpoints.first_batch) == (app, 3)

    checkpoint = source.checkpoints.load()
    assert (checkpoint.version, checkpoint.committed_batch, checkpoint.next_batch) == (2, 4, 5)
    assert (checkpoint.min_event_time_ms, checkpoint.max_event_time_ms) == (T + 5_000, T + 190_000)
    assert checkpoint.recent_batches == [(3, T + 5_000), (4, T + 30_000)]
    assert checkpoint.taken_files == ["a.jsonl"]  # format 2 keeps the paths only; the plans keep the rest
    assert (checkpoint.totals, checkpoint.watermark) == ({"inserted": 9, "received": 10}, {"watermark_ms": T + 151_000})
    assert checkpoint.updated_at_ms == T + 200_000

    assert source.checkpoints.get_plan(5) == BatchPlan(
        batch_id=5, kind="files", horizon_floor_ms=None, planned_at_ms=T + 100_000,
        files=(FileEntry(path="b.jsonl", size=64, sha256=SHA_B),),
    )

    closes = CloseStore(lake.panes(), "event_counts")
    assert closes.latest(Window(T, T + 60_000)) == PaneClose(
        window_start_ms=T, pane=1, timing="on_time", raw_version=7, max_batch_id=4, watermark_ms=T + 151_000,
        closed_at_ms=T + 160_000,
    )

    commits = CommitStore(lake.commits(), clock=lambda: T + 170_000)
    assert commits.get(SEQ) == SequenceRecord(
        id=SEQ, steps=({"asset": "event_counts", "kind": "high_watermark", "published_through_ms": T + 60_000},),
        max_attempts=5, created_at_ms=T + 161_000,
    )
    state = commits.state(SEQ)
    assert (state.revision, state.status, state.steps, state.last_error, state.history) == (
        2, PENDING, (PENDING,), "boom", ())
    assert state.attempts == (Attempt(number=1, run_id="r1", root_run_id="r1", started_at_ms=T + 162_000,
                                      finished_at_ms=T + 163_000, outcome=FAILED, error="boom"),)
    assert commits.unfinished() == [SEQ]

    # The new code carries on from the old documents, writing the current format beside them.
    assert commits.start_attempt(SEQ, run_id="r2", root_run_id="r2") == 2
    assert commits.state(SEQ).revision == 3
    written = json.loads(lake.commits().read(f"state/{SEQ}/0000000003.json") or b"")
    assert (written["version"], written["attempts"][0]["error"], "revision" in written) == (1, "boom", False)
    source.checkpoints.update(lambda c: c.model_copy(update={"committed_batch": 5}))
    rewritten = json.loads(lake.checkpoints().read(f"{app}/checkpoint.json") or b"")
    assert (rewritten["version"], rewritten["committed_batch"], rewritten["taken_files"]) == (2, 5, ["a.jsonl"])
    assert epochs.advance("events", 6) == 2
    assert (epochs.current("events"), epochs.first_batches("events")) == (2, [1, 3, 6])


def test_an_epoch_from_before_epochs_recorded_their_first_batches_loads(home: Path) -> None:
    lake = LakeResource(home=str(home))
    lake.epochs().write("events.json", b'{"epoch": 2, "at_ms": 1700000000500}')
    epochs = EpochStore(lake.epochs())
    assert (epochs.current("events"), epochs.first_batches("events")) == (2, [1, 1, 1])


def commit_with_plan(source: SourceRuntime, batch: int, plan: bytes) -> None:
    """A commit of `batch` to the raw table carrying `plan` in its metadata, as 7acc293's ingest made it."""
    metadata = (b'{"onceflow_attempt": "0123456789abcdef0123456789abcdef", "onceflow_batch": %d, '
                b'"onceflow_plan": %s, "onceflow_source": "%s"}' % (batch, plan, source.app_id.encode()))
    write_deltalake(source.raw_path, pa.table({"record_id": ["e1"]}), mode="append",
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": metadata.decode()},
                                                       app_transactions=[Transaction(source.app_id, batch)]))


def test_a_plan_carried_by_a_delta_commit_in_the_previous_format_loads(tmp_path: Path, home: Path) -> None:
    lake = LakeResource(home=str(home))
    source = open_source(files_pipeline(tmp_path / "in"), lake)
    commit_with_plan(source, 5, PLAN_V0)
    assert source.checkpoints.get_plan(5) is None  # the checkpoints lost it: only the lake has it
    assert source.plans.plan_of(5) == BatchPlan(
        batch_id=5, kind="files", horizon_floor_ms=None, planned_at_ms=T + 100_000,
        files=(FileEntry(path="b.jsonl", size=64, sha256=SHA_B),),
    )

    commit_with_plan(source, 6, PLAN_V0.replace(b'"batch_id": 5', b'"batch_id": 6, "version": 7'))
    where = (f"the Delta commit of {source.app_id} batch 6 (userMetadata onceflow_plan) in {source.raw_path} or "
             f"{source.dead_letter_path}")
    with pytest.raises(UnknownStateVersion, match=rf"^{re.escape(where)}: BatchPlan format version 7 is unknown "
                                                  r"\(this onceflow reads versions up to 2\)"):
        source.plans.plan_of(6)


def future(document: bytes) -> bytes:
    """`document` as a newer onceflow might write it: format version 9, with a field this code does not know."""
    return document[:-1] + b', "version": 9, "shards": 4}'


FUTURE_CASES: dict[str, tuple[str, str, bytes, Callable[[LakeResource], object]]] = {
    "epoch": ("epochs", "events.json", EPOCH_V0, lambda lake: EpochStore(lake.epochs()).current("events")),
    "checkpoint": ("checkpoints", "s/checkpoint.json", CHECKPOINT_V0,
                   lambda lake: CheckpointStore(lake.checkpoints(), "s").load()),
    "plan": ("checkpoints", "s/batches/000000000005.json", PLAN_V0,
             lambda lake: CheckpointStore(lake.checkpoints(), "s").get_plan(5)),
    "pane close": ("panes", f"a/closes/{T:015d}/pane-0001.json", CLOSE_V0,
                   lambda lake: CloseStore(lake.panes(), "a").latest(Window(T, T + 60_000))),
    "commit sequence": ("commits", f"sequences/{SEQ}.json", SEQUENCE_V0, lambda lake: CommitStore(lake.commits()).get(SEQ)),
    "commit state": ("commits", f"state/{SEQ}/0000000002.json", STATE_V0,
                     lambda lake: CommitStore(lake.commits()).state(SEQ)),
}


@pytest.mark.parametrize("case", FUTURE_CASES)
def test_a_document_from_a_newer_onceflow_fails_naming_where_it_is(home: Path, case: str) -> None:
    store, key, document, load = FUTURE_CASES[case]
    lake = LakeResource(home=str(home))
    lake.commits().write(f"sequences/{SEQ}.json", SEQUENCE_V0)  # the commit state's sequence
    getattr(lake, store)().write(key, future(document))
    where = str(home / store / key)
    # format 2 of a checkpoint keeps the paths of the files taken only; format 2 of a plan carries its contract and log
    known = 2 if case in ("checkpoint", "plan") else 1
    with pytest.raises(UnknownStateVersion, match=rf"^{re.escape(where)}: \w+ format version 9 is unknown "
                                                  rf"\(this onceflow reads versions up to {known}\)") as raised:
        load(lake)
    assert (raised.value.where, raised.value.found, raised.value.known) == (where, 9, known)


def test_a_document_that_does_not_match_its_format_fails_naming_where_it_is(home: Path) -> None:
    lake = LakeResource(home=str(home))
    lake.panes().write(f"a/closes/{T:015d}/pane-0001.json", CLOSE_V0.replace(b'"pane": 1', b'"pane": "one"'))
    lake.checkpoints().write("s/checkpoint.json", b'{"committed_batch": 4')  # torn
    with pytest.raises(InvalidStoredState, match=rf"^{re.escape(str(home))}/panes/a/closes/{T:015d}/pane-0001.json: "
                                                 r"not a valid PaneClose of format 1: 1 validation error for PaneClose\npane\n"):
        CloseStore(lake.panes(), "a").latest(Window(T, T + 60_000))
    with pytest.raises(InvalidStoredState, match=rf"^{re.escape(str(home))}/checkpoints/s/checkpoint.json: not JSON"):
        CheckpointStore(lake.checkpoints(), "s").load()


def test_a_checkpoint_of_format_1_keeps_the_paths_of_the_files_it_took(home: Path) -> None:
    lake = LakeResource(home=str(home))
    lake.checkpoints().write("s/checkpoint.json", CHECKPOINT_V0[:-1] + b', "version": 1}')
    checkpoint = CheckpointStore(lake.checkpoints(), "s").load()
    assert (checkpoint.version, checkpoint.committed_batch, checkpoint.taken_files) == (2, 4, ["a.jsonl"])
