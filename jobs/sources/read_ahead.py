"""Reading a source's next batch while the batch before it commits.

A batch's one Spark action (`onceflow.jobs.ingest.batch_read.read_batch`) depends on nothing but its plan. Once a
batch is read, its records' event times say what checkpoint it will leave (bar the clock), and so what plan the
next batch would have. That batch's read begins on a thread of its own, beside the decisions, commits and
checkpoint update of the batch before it, while Spark's executors would otherwise wait.

The next batch uses that read only if the plan it records is the one read ahead: the same batch number, files
(fingerprinted) and horizon floor (`SourceReader.next_plan` records the proposal itself then). Anything else (the
watermark moved with the clock, another run took the batch, a file changed) drops it, and the batch is read as
usual. Nothing is recorded for a read ahead: the protocol of every batch stays plan recorded, then read, then
committed, and a process that dies meanwhile leaves nothing of it behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from onceflow.jobs.sources.checkpoint import BatchPlan

if TYPE_CHECKING:  # `SourceRuntime` holds a `ReadAhead`, and a batch's read needs the runtime
    from onceflow.jobs.ingest.batch_read import BatchRead

log = logging.getLogger("onceflow")
_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-read-ahead")


class ReadAhead:
    """A source's next batch read ahead: the plan proposed for it, and its read (`BatchRead`), begun."""

    def __init__(self) -> None:
        self.proposal: BatchPlan | None = None
        self._read: Future | None = None

    def begin(self, proposal: BatchPlan, read: Callable[[], BatchRead], after: Future | None) -> None:
        """Begin `read` of the batch planned as `proposal`, once `after` (the batch before's last Spark work, its
        dead letters explained and committed) is done: Spark runs the tasks of jobs in the order they came, and
        the batch before must not wait behind this one."""
        self.drop()

        def run() -> BatchRead:
            if after is not None:
                after.exception()  # its failure is the batch before's to report
            return read()

        self.proposal, self._read = proposal, _reader.submit(run)

    def take(self, plan: BatchPlan | None) -> BatchRead | None:
        """The batch read ahead if it was proposed as `plan` (and read without error), else None: the batch is
        read as usual. Either way nothing is read ahead afterwards."""
        proposal, pending = self.proposal, self._read
        self.proposal = self._read = None
        if pending is None:
            return None
        failed = pending.exception()  # waits
        if failed is not None:
            log.info(f"batch {proposal.batch_id if proposal else '?'} read ahead failed ({failed}); read again")
            return None
        if proposal != plan:
            pending.result().release()
            return None
        return pending.result()

    def settle(self) -> None:
        """Wait until what is read ahead is read (or failed), keeping it."""
        if self._read is not None:
            self._read.exception()

    def drop(self) -> None:
        """Wait for what is read ahead, and let go of it."""
        self.take(None)
