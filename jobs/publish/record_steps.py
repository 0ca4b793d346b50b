"""The commit steps of a record output's publication: `RecordWrite` (one sink holds one commit) and `StagedDrop`
(the staged rows let go once every sink holds them); `onceflow.jobs.publish.record_sequence` writes them."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import ClassVar

import pyarrow.parquet as pq

from onceflow.jobs.declare.sink import Commit
from onceflow.jobs.publish.step import CommitContext, CommitStep, sha256_hex


@dataclass(frozen=True)
class RecordWrite(CommitStep):
    """Sink `sink` of record output `asset` holds the commit (`pipeline`, `asset`, `epoch`, `batch`): the `rows`
    rows staged at `staged_root`/`staged_key` (Parquet, `sha256`). Verified by the sink's `committed`; executed by
    its `write` of the staged rows, which must hold exactly the bytes the sequence recorded."""

    kind: ClassVar[str] = "record_write"
    asset: str
    sink: str
    pipeline: str
    epoch: int
    batch: int
    staged_root: str
    staged_key: str
    sha256: str
    rows: int

    @property
    def commit(self) -> Commit:
        return Commit(self.pipeline, self.asset, self.epoch, self.batch)

    def describe(self) -> str:
        return f"{self.kind} {self.asset} batch {self.batch} to {self.sink}"

    def verify(self, ctx: CommitContext) -> bool:
        return ctx.record_sink(self.asset, self.sink).committed(self.commit)

    def execute(self, ctx: CommitContext) -> None:
        sink = ctx.record_sink(self.asset, self.sink)
        staged = ctx.sink(self.staged_root)
        data = staged.read(self.staged_key)
        if data is None or sha256_hex(data) != self.sha256:
            raise ValueError(f"the staged rows {staged.url(self.staged_key)} are "
                             f"{'gone' if data is None else 'not the bytes the sequence recorded'}")
        rows = pq.read_table(io.BytesIO(data))
        if rows.num_rows != self.rows:
            raise ValueError(f"{staged.url(self.staged_key)} holds {rows.num_rows} rows, the sequence {self.rows}")
        sink.write(rows, self.commit)


@dataclass(frozen=True)
class StagedDrop(CommitStep):
    """The staged file `root`/`key` is gone: the last step, once every sink holds the rows."""

    kind: ClassVar[str] = "staged_drop"
    root: str
    key: str

    def describe(self) -> str:
        return f"{self.kind} {self.root}/{self.key}"

    def verify(self, ctx: CommitContext) -> bool:
        return not ctx.sink(self.root).exists(self.key)

    def execute(self, ctx: CommitContext) -> None:
        ctx.sink(self.root).delete(self.key)
