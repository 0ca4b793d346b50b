"""The ingest run's publisher (`RecordPublisher`) while a sink cannot be reached: the batches after the one that
found it down are staged and written ahead but not tried until that one's wait is over, then all of them land in
batch order, each once. Real Spark micro-batches of a file source, a sink of the test's own (a fake of a remote
system, counting every call it gets)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from onceflow import Commit, FileSource, Pipeline, RecordOutput, Sink, SinkUnavailable
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.publish import commit_records
from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.record_publisher import RecordPublisher
from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings


@dataclass(frozen=True, kw_only=True)
class Remote(Sink):
    """A remote system in memory: down while `state["down"]`; `calls` counts every call it got."""

    state: dict = field(default_factory=lambda: {"down": True, "calls": 0, "held": {}}, hash=False)

    def write(self, rows: pa.Table, commit: Commit) -> None:
        self._call()
        self.state["held"].setdefault(commit.batch, rows.column("record_id").to_pylist())

    def committed(self, commit: Commit) -> bool:
        self._call()
        return commit.batch in self.state["held"]

    def _call(self) -> None:
        self.state["calls"] += 1
        if self.state["down"]:
            raise SinkUnavailable("remote: connection timed out (a silent host)")


def test_batches_after_an_unreachable_sink_wait_for_it_then_land_in_order(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit_records, "UNAVAILABLE_FIRST_WAIT_S", 600.0)  # outlasts the batches below
    sink = Remote()
    pipeline = resolve(Pipeline(name="orders", source=FileSource(directory=str(tmp_path / "in"), id_field="order_id",
                                                                  timestamp_field="ts", max_files=1),
                                schema="qty INT", outputs=[RecordOutput(asset="orders_copy", sinks=[sink])]),
                       load_settings())
    (tmp_path / "in").mkdir()
    lake = LakeResource(home=str(home))
    source = open_source(pipeline, lake)
    publisher = RecordPublisher(source, lake, ("run-1", "run-1"))

    def batch(n: int) -> list:
        (tmp_path / "in" / f"{n}.jsonl").write_text(json.dumps({"order_id": f"o{n}", "ts": 1_795_000_000_000,
                                                                "qty": n}) + "\n")
        result = run_micro_batch(lambda: spark, source)
        assert result is not None
        return publisher.publish(lambda: spark, result.batch_id, result.raw_version)

    (first,) = batch(1)
    assert first.result.outcome == "failed" and sink.state["calls"] == 1  # found down once
    assert batch(2) == [] and batch(3) == []  # staged, not tried: the sink is still in its wait
    assert sink.state["calls"] == 1
    store = publisher.ctx.store
    assert sorted(s for s in store.sequences() if s.startswith("orders_copy:")) == [
        f"orders_copy:epoch-0:batch-{n:012d}" for n in (1, 2, 3)]  # written ahead: the commit sensor sees them

    monkeypatch.setattr(commit_records, "UNAVAILABLE_FIRST_WAIT_S", 0.0)  # its wait is over
    sink.state["down"] = False
    published = batch(4)
    assert [(p.batch, p.result.outcome) for p in published] == [(n, "done") for n in (1, 2, 3, 4)]
    assert sink.state["held"] == {n: [f"o{n}"] for n in (1, 2, 3, 4)}
    assert all(store.state(s).status == DONE for s in store.sequences() if s.startswith("orders_copy:"))
    publisher.close()
