"""The sink contract (`onceflow.Sink`) and record output declarations, without Spark: docs/sinks.md's worked user
sink run through real commit sequences (staged rows, `record_write` steps, a crash between steps, a retry), and
the declaration mistakes a record output fails on at load."""

from __future__ import annotations

import io
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow import (
    BigQuerySink,
    Commit,
    DeclarationError,
    FileSink,
    FileSource,
    KafkaSink,
    Pipeline,
    PostgresSink,
    RecordOutput,
    Sink,
    SinkUnavailable,
    WindowedOutput,
)
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_steps import RecordWrite, StagedDrop
from onceflow.jobs.publish.sequence import CommitSequence, run_sequence
from onceflow.jobs.publish.step import CommitContext, sha256_hex
from onceflow.resources.object_store import open_store

DOCS = Path(__file__).parent.parent / "docs" / "sinks.md"


def user_sink_class() -> type:
    """The worked example of docs/sinks.md, run as written."""
    block = re.findall(r"```python\n(.*?)```", DOCS.read_text().split("## A sink of your own", 1)[1], re.S)[0]
    namespace: dict = {}
    exec(compile(block, str(DOCS), "exec"), namespace)
    return namespace["SqliteSink"]


def staged_sequence(
    tmp_path: Path, store: CommitStore, rows: pa.Table, sink_name: str, batch: int, asset: str = "orders_copy"
) -> str:
    """A record output's publication of `rows` as batch `batch`, staged and written ahead as `stage_batch` does."""
    buffer = io.BytesIO()
    pq.write_table(rows, buffer)
    staging = f"{tmp_path}/staging"
    key = f"records/{asset}/batch={batch}.parquet"
    open_store(staging).write(key, buffer.getvalue())
    seq_id = f"{asset}:epoch-0:batch-{batch:012d}"
    steps = (RecordWrite(asset=asset, sink=sink_name, pipeline="orders", epoch=0, batch=batch,
                         staged_root=staging, staged_key=key, sha256=sha256_hex(buffer.getvalue()),
                         rows=rows.num_rows), StagedDrop(root=staging, key=key))
    CommitSequence(seq_id, steps).write(store)
    return seq_id


def test_the_worked_user_sink_holds_each_batch_once_through_a_crash_and_a_retry(tmp_path: Path) -> None:
    sink = user_sink_class()(path=str(tmp_path / "orders.db"), table="orders")
    output = RecordOutput(asset="orders_copy", sinks=[sink])
    store = CommitStore(open_store(f"{tmp_path}/commits"))
    ctx = CommitContext(store, records={"orders_copy": output})
    first = pa.table({"record_id": ["a", "b"], "total": [1, 2]})
    seq = staged_sequence(tmp_path, store, first, sink.name, 1)
    # A run that wrote the rows and died before recording the step: the next one finds them and writes nothing.
    sink.write(first, Commit("orders", "orders_copy", 0, 1))
    assert run_sequence(ctx, seq, "run-2").outcome == "done"
    second = staged_sequence(tmp_path, store, pa.table({"record_id": ["c"], "total": [3]}), sink.name, 2)
    result = run_sequence(ctx, second, "run-3")
    assert (result.outcome, result.executed) == ("done", (0, 1))
    sink.write(first, Commit("orders", "orders_copy", 0, 1))  # a zombie's late retry changes nothing
    with sqlite3.connect(tmp_path / "orders.db") as db:
        assert sorted(db.execute("SELECT record_id, total FROM orders")) == [("a", "1"), ("b", "2"), ("c", "3")]
    assert not open_store(f"{tmp_path}/staging").list("records")


def test_a_sequence_whose_sink_is_no_longer_declared_fails_naming_it(tmp_path: Path) -> None:
    sink = user_sink_class()(path=str(tmp_path / "orders.db"), table="orders")
    store = CommitStore(open_store(f"{tmp_path}/commits"))
    seq = staged_sequence(tmp_path, store, pa.table({"record_id": ["a"]}), sink.name, 1)
    renamed = user_sink_class()(path=str(tmp_path / "orders.db"), table="orders_v2")
    ctx = CommitContext(store, records={"orders_copy": RecordOutput(asset="orders_copy", sinks=[renamed])})
    result = run_sequence(ctx, seq, "run-1")
    assert result.outcome == "failed"
    assert "has no sink 'sqlite:orders' now (it has sqlite:orders_v2)" in (result.error or "")


def declare(*outputs: object) -> Pipeline:
    return Pipeline(name="orders", source=FileSource(directory="/data", timestamp_field="ts"),
                    schema="order_id STRING, qty INT", outputs=list(outputs))  # type: ignore[arg-type]


@pytest.mark.parametrize(("output", "error"), [
    (RecordOutput(asset="copy", sinks=[]), "outputs[0] ('copy').sinks: name at least one sink"),
    (RecordOutput(asset="copy", sinks=[BigQuerySink(table="bad-name", dataset="d")]),
     "outputs[0] ('copy').sinks[0]: table 'bad-name' is not a BigQuery name"),
    (RecordOutput(asset="copy", sinks=[PostgresSink(dsn="postgresql://", table="t", mode="upsert")]),
     "sinks[0]: mode 'upsert' needs key=[...]"),
    (RecordOutput(asset="copy", sinks=[PostgresSink(dsn="x", table="Bad-Name")]), "table 'Bad-Name'"),
    (RecordOutput(asset="copy", sinks=[KafkaSink(bootstrap_servers="b:9092", topic="t",
                                                 options={"transactional.id": "mine"})]),
     "options: 'transactional.id' is onceflow's to set"),
    (RecordOutput(asset="copy", sinks=[FileSink(path="/a"), FileSink(path="/a", format="parquet")]),
     "two sinks are called 'files:/a'"),
    (RecordOutput(asset="copy", sinks=[FileSink(format="csv")]), "format 'csv'"),  # type: ignore[arg-type]
    (WindowedOutput(asset="w", window="1m", transform=lambda df: df, sinks=[FileSink(format="parquet")]),
     "outputs[0] ('w').sinks[0].format: 'parquet': window panes are published as 'jsonl'"),
])
def test_a_record_output_mistake_fails_the_declaration_naming_the_field(output: object, error: str) -> None:
    with pytest.raises(DeclarationError, match=re.escape(error)):
        declare(output)


def test_one_sink_alone_is_one_sink_and_outputs_share_no_asset_name() -> None:
    sink = FileSink(path="/out", format="parquet")
    assert RecordOutput(asset="copy", sinks=sink).sinks == (sink,)
    with pytest.raises(DeclarationError, match="'copy' is declared twice"):
        declare(RecordOutput(asset="copy", sinks=[sink]),
                WindowedOutput(asset="copy", window="1m", transform=lambda df: df))
    assert "dsn" not in repr(PostgresSink(dsn="postgresql://user:secret@host/db", table="t"))


@dataclass(frozen=True, kw_only=True)
class Flaky(Sink):
    """A user's sink whose system is unreachable for its first `down` calls."""

    down: int
    calls: list[str] = field(default_factory=list, compare=False)

    def write(self, rows: pa.Table, commit: Commit) -> None:
        self.calls.append("write")
        if len(self.calls) <= self.down:
            raise SinkUnavailable("the API answers 503")

    def committed(self, commit: Commit) -> bool:
        return "write" in self.calls[self.down:]


def test_a_user_sink_that_says_it_is_unavailable_uses_no_attempt(tmp_path: Path) -> None:
    sink = Flaky(down=8)
    store = CommitStore(open_store(f"{tmp_path}/commits"))
    ctx = CommitContext(store, records={"orders_copy": RecordOutput(asset="orders_copy", sinks=[sink])})
    seq = staged_sequence(tmp_path, store, pa.table({"record_id": ["a"]}), sink.name, 1)
    outcomes = [run_sequence(ctx, seq, f"run-{n}").outcome for n in range(9)]
    assert outcomes == ["failed"] * 8 + ["done"]  # eight failures, more than the budget of 5: never quarantined
    assert store.state(seq).attempts_used == 1
