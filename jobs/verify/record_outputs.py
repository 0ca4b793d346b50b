"""Reconciling a record output with its sinks, batch by batch, from facts read each their own way: the raw table's
log (which batches committed, how many rows each inserted), the commit store (which batches were staged, how many
rows each publishes, which are done) and every sink, asked read-only (`committed`, and the rows its marker or
object says it holds, where it can tell).

An output's account holds when every raw batch from its first publication on has one (none skipped), every done
publication is held by every sink with the rows it staged, and, for an output without a transform, the rows a
batch publishes are the rows it inserted. Publications not done yet are its lag, not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onceflow.jobs.declare.record_output import RecordOutput, close_sinks
from onceflow.jobs.delta.commit_log import committed_rows
from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_sequence import batch_of, publications_of
from onceflow.jobs.sources.reader import SourceRuntime


@dataclass
class RecordReconciliation:
    """One record output's account: `published` batches done in every sink, `pending` batch numbers not done yet,
    `problems` what breaks exactly-once (a batch skipped, a sink without a done batch or with other rows)."""

    asset: str
    raw_batches: int = 0
    published: int = 0
    rows: int = 0
    last_published: int | None = None
    pending: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def reconcile_records(source: SourceRuntime, output: RecordOutput, commits: CommitStore) -> RecordReconciliation:
    """The account of `output`, whose batches come from `source`'s raw table (this epoch's)."""
    account = RecordReconciliation(output.asset)
    publications = publications_of(commits, output.asset)
    if not publications:
        return account
    numbers = [batch_of(seq) for seq, _ in publications]
    raw_rows = committed_rows(source.raw_path, source.app_id, range(numbers[0], max(numbers) + 1))
    account.raw_batches = len(raw_rows)
    skipped = sorted(set(raw_rows) - set(numbers))
    if skipped:
        account.problems.append(f"raw batches never published: {', '.join(map(str, skipped[:10]))}")
    try:
        for seq, writes in publications:
            batch = batch_of(seq)
            if commits.state(seq).status != DONE:
                account.pending.append(batch)
                continue
            staged = writes[0].rows if writes else 0
            if output.transform is None and batch in raw_rows and raw_rows[batch] != staged:
                account.problems.append(f"batch {batch}: raw inserted {raw_rows[batch]} rows, {staged} published")
            for write in writes:
                sink = output.sink(write.sink)
                if not sink.committed(write.commit):
                    account.problems.append(f"batch {batch}: done, but {write.sink} does not hold it")
                    continue
                held = sink.rows(write.commit)
                if held is not None and held != staged:
                    account.problems.append(f"batch {batch}: {write.sink} holds {held} rows, {staged} published")
            account.published += 1
            account.rows += staged
            account.last_published = batch
    finally:
        close_sinks([output])
    return account
