"""Commit steps and sequences: side effects that leave the platform exactly once (Gobblin's CommitStepStore).

A `CommitSequence` is the ordered list of `CommitStep`s that publish one result. It is written to the
`CommitStore` before any step runs; `run_sequence` then takes each step not yet recorded as done and

1. calls `verify()`: if the step's effect is already in place (an earlier attempt got that far and died before
   recording it), the step is recorded as done without touching anything;
2. otherwise calls `execute()`, which brings the effect about from whatever an earlier partial attempt left,
   then `verify()` again, which must now succeed, and records the step as done.

Every step is idempotent (executing it again, or concurrently with another runner, has the effect of executing it
once) and its `verify()` is read-only. So a sequence left unfinished by a crashed or failed run is finished by
simply running it again, any number of times, from anywhere. Attempts are counted per sequence; when the budget
is used up the sequence is quarantined until an operator re-arms it (`CommitStore.rearm`).

Steps:

- `FileFinalize`: move a temp file to its deterministic final name in the file sink.
- `BigQueryLoad`: replace a window's rows in a BigQuery table with one pane's rows, through deterministic job ids.
- `HighWatermark`: record how far an asset has been published.

Example::

    ctx = CommitContext(CommitStore(lake.commits()), bigquery=lambda project: bigquery_resource.get_client())
    for sequence_id in ctx.store.unfinished():
        result = run_sequence(ctx, sequence_id, run_id=run.run_id, root_run_id=run.root_run_id)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from resources.commit_store import (
    DEFAULT_MAX_ATTEMPTS,
    DONE,
    FAILED,
    QUARANTINED,
    CommitStore,
    SequenceClosed,
    SequenceRecord,
    asset_key_part,
    checked_sequence_id,
)
from resources.faults import crash_point
from resources.object_store import LocalStore, ObjectStore, fsync_dir, open_store

if TYPE_CHECKING:
    from google.cloud import bigquery

BigQueryClients = Callable[[str], AbstractContextManager["bigquery.Client"]]
"""Given a project, a context manager yielding a BigQuery client: `BigQueryResource.get_client` fits
(`lambda project: resource.get_client()`), and so does a function returning a `bigquery.Client`."""

S = TypeVar("S", bound="type[CommitStep]")


def sequence_id(asset: str, window_key: str, pane: int) -> str:
    """The id of the sequence publishing pane `pane` of window `window_key` of `asset`, e.g.
    `event_counts:2026-11-21-10:05:pane-1`. A pure function of its arguments: publishing a pane twice finds the
    first sequence."""
    return checked_sequence_id(f"{asset_key_part(asset)}:{window_key}:pane-{pane}")


def sequence_asset(seq_id: str) -> str:
    """The asset a sequence made by `sequence_id` publishes (`event_counts`, `team/event_counts`)."""
    return checked_sequence_id(seq_id).split(":", 1)[0].replace(".", "/")


@dataclass(frozen=True)
class CommitContext:
    """What steps need at run time, as opposed to what they are (their parameters, stored in the sequence).

    `store` is the commit store (where `HighWatermark` records and `run_sequence` keeps progress); `bigquery`
    opens BigQuery clients for `BigQueryLoad` (None: sequences with such a step fail with a clear error);
    `bigquery_timeout_s` bounds the wait for one BigQuery job. `sinks` maps a file sink root, as named in the
    steps, to its open `ObjectStore`; a root not in it is opened with `open_store` on first use.
    """

    store: CommitStore
    bigquery: BigQueryClients | None = None
    bigquery_timeout_s: float = 600.0
    sinks: dict[str, ObjectStore] = field(default_factory=dict, compare=False, repr=False)

    def bigquery_client(self, project: str) -> AbstractContextManager[bigquery.Client]:
        if self.bigquery is None:
            raise RuntimeError("this commit sequence loads BigQuery, but no BigQuery client was configured")
        return self.bigquery(project)

    def sink(self, root: str) -> ObjectStore:
        """The file sink rooted at `root` (a directory or `gs://` URL), opened once per context."""
        if root not in self.sinks:
            self.sinks[root] = open_store(root)
        return self.sinks[root]


_KINDS: dict[str, type[CommitStep]] = {}


def register_step(cls: S) -> S:
    """Class decorator: make a step kind known to `CommitStep.from_dict` (stored sequences name steps by kind)."""
    if cls.kind in _KINDS and _KINDS[cls.kind] is not cls:
        raise ValueError(f"commit step kind {cls.kind!r} is registered twice")
    _KINDS[cls.kind] = cls
    return cls


class CommitStep(ABC):
    """One side effect of a commit sequence.

    Subclasses are frozen dataclasses whose fields are the step's parameters (JSON values; lists are read back as
    tuples), and have a unique `kind`. Contract:

    - `verify(ctx)` is True exactly when the effect is fully in place; it changes nothing.
    - `execute(ctx)` brings the effect about starting from any state an earlier, interrupted `execute` (or none)
      left, and tolerates another runner executing the same step at the same time. It may return without error
      and still leave `verify()` False (e.g. when the effect cannot be produced any more); the runner checks.
    """

    kind: ClassVar[str]

    @abstractmethod
    def verify(self, ctx: CommitContext) -> bool: ...

    @abstractmethod
    def execute(self, ctx: CommitContext) -> None: ...

    def describe(self) -> str:
        """A one-line description for errors and logs."""
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        """The step as stored in its sequence: `{"kind": ..., <parameter>: <value>, ...}`."""
        params = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        return {"kind": self.kind, **json.loads(json.dumps(params))}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> CommitStep:
        """The step `data` describes (see `to_dict`); raises `ValueError` for an unknown kind."""
        params = dict(data)
        kind = params.pop("kind")
        cls = _KINDS.get(kind)
        if cls is None:
            raise ValueError(f"unknown commit step kind {kind!r} (known: {sorted(_KINDS)})")
        return cls(**{name: _tuples(value) for name, value in params.items()})


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


@dataclass(frozen=True)
class CommitSequence:
    """An ordered list of steps with a deterministic id; see the module docstring for how it is run."""

    id: str
    steps: tuple[CommitStep, ...]
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def to_record(self) -> SequenceRecord:
        return SequenceRecord(self.id, tuple(s.to_dict() for s in self.steps), self.max_attempts)

    @classmethod
    def from_record(cls, record: SequenceRecord) -> CommitSequence:
        return cls(record.id, tuple(CommitStep.from_dict(s) for s in record.steps), record.max_attempts)

    def write(self, store: CommitStore) -> tuple[CommitSequence, bool]:
        """Write the sequence ahead of any step. Returns the sequence that stands and whether it is this one
        (False: a sequence with this id was written before, and that one stands)."""
        if store.write_sequence(self.to_record()):
            return self, True
        existing = store.get(self.id)
        assert existing is not None  # sequences are never deleted while anyone may still write them
        return CommitSequence.from_record(existing), False


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- files ----------------------------------------------------------------------------------------------------


@register_step
@dataclass(frozen=True)
class FileFinalize(CommitStep):
    """Move `temp_key` to `final_key` inside the file sink at `root`, which holds the bytes with `sha256`.

    Verified when the final file exists with exactly those bytes and the temp file is gone. On local disk the move
    is an `os.replace` (atomic); on object storage it is a copy then a delete, which a crash can interrupt
    between the two: then the final file is already right and executing again only deletes the temp file. The
    final name is chosen by the publisher, deterministic per window, pane and shard (see `jobs.publish`).
    """

    kind: ClassVar[str] = "file_finalize"
    root: str
    temp_key: str
    final_key: str
    sha256: str

    def describe(self) -> str:
        return f"{self.kind} {self.root}/{self.final_key}"

    def verify(self, ctx: CommitContext) -> bool:
        sink = ctx.sink(self.root)
        final = sink.read(self.final_key)
        return final is not None and sha256_hex(final) == self.sha256 and not sink.exists(self.temp_key)

    def execute(self, ctx: CommitContext) -> None:
        sink = ctx.sink(self.root)
        final = sink.read(self.final_key)
        if final is not None and sha256_hex(final) == self.sha256:
            sink.delete(self.temp_key)
            return
        data = sink.read(self.temp_key)
        if data is None:
            final = sink.read(self.final_key)  # a concurrent runner may have moved it since the first look
            if final is not None and sha256_hex(final) == self.sha256:
                return
            raise FileNotFoundError(
                f"neither the temp file {sink.url(self.temp_key)} nor a final file {sink.url(self.final_key)} "
                "with the expected bytes exists"
            )
        if sha256_hex(data) != self.sha256:
            raise ValueError(f"temp file {sink.url(self.temp_key)} does not hold the bytes the sequence expects")
        if isinstance(sink, LocalStore):
            # A concurrent runner may win the rename: verify() then finds its result.
            with suppress(FileNotFoundError):
                os.replace(sink.url(self.temp_key), sink.url(self.final_key))
            fsync_dir(Path(os.path.dirname(sink.url(self.final_key))))
        else:
            sink.write(self.final_key, data)
            sink.delete(self.temp_key)


# --- BigQuery -------------------------------------------------------------------------------------------------

_BQ_TYPES = frozenset(
    {"STRING", "INT64", "INTEGER", "NUMERIC", "BIGNUMERIC", "FLOAT64", "FLOAT", "BOOL", "BOOLEAN", "TIMESTAMP",
     "DATE", "DATETIME"}
)
SUMMABLE_TYPES = frozenset({"INT64", "INTEGER", "NUMERIC", "BIGNUMERIC"})
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,299}$")
_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,127}$")
_MAX_GENERATIONS = 100


@register_step
@dataclass(frozen=True)
class BigQueryLoad(CommitStep):
    """Make the BigQuery table `project.dataset.table` hold exactly pane `pane`'s rows for one window.

    The rows are the newline-delimited JSON files `files` ((key, sha256) pairs under `files_root`, normally the
    finalized shards of the file sink), with columns `schema` ((name, BigQuery type) pairs; `window_start`
    TIMESTAMP and `pane` INT64 among them). `execute`:

    1. creates the table if it does not exist (the dataset must exist);
    2. loads the files into a staging table beside it (truncating it) with a load job;
    3. MERGEs the staging table into the table with a query job, keyed on `key_columns`: the window's rows are
       replaced by the pane's (rows of keys the pane lacks are deleted), unless the table holds a newer pane of
       the window already, in which case nothing changes (a refired pane replaces, a stale one never does);
    4. drops the staging table.

    Job ids are a pure function of (asset, window, pane, job, target table) plus a generation: a job id that
    exists already (409 Conflict) means an earlier attempt or a concurrent runner submitted that job, whose
    result is then waited for and used. Only when that job failed (a failed job changes nothing) or its result is
    gone (the staging table was dropped) is the next generation's id used. Both jobs are idempotent in effect
    anyway: the load truncates, the MERGE replaces the window.

    `verify` is True when the table holds, for the window, only rows of this pane numbering `expected_rows` whose
    column sums equal `expected_sums` ((column, decimal string or None) pairs), or holds a newer pane.
    """

    kind: ClassVar[str] = "bigquery_load"
    project: str
    dataset: str
    table: str
    asset: str
    window_key: str
    window_start_ms: int
    pane: int
    files_root: str
    files: tuple[tuple[str, str], ...]
    schema: tuple[tuple[str, str], ...]
    expected_rows: int
    expected_sums: tuple[tuple[str, str | None], ...] = ()
    key_columns: tuple[str, ...] = ("window_start", "key")

    def __post_init__(self) -> None:
        if not _PROJECT.match(self.project):
            raise ValueError(f"invalid BigQuery project {self.project!r}")
        for name in (self.dataset, self.table):
            if not _COLUMN.match(name):
                raise ValueError(f"invalid BigQuery dataset or table name {name!r}: letters, digits and '_' only")
        columns = dict(self.schema)
        for name, kind in self.schema:
            if not _COLUMN.match(name) or kind not in _BQ_TYPES:
                raise ValueError(f"invalid BigQuery column {name!r} {kind!r}")
        for name in ("window_start", "pane", *self.key_columns, *(c for c, _ in self.expected_sums)):
            if name not in columns:
                raise ValueError(f"BigQuery schema {self.schema} lacks the column {name!r}")

    def describe(self) -> str:
        return f"{self.kind} {self.final_table} window {self.window_key} pane {self.pane}"

    @property
    def final_table(self) -> str:
        return f"{self.project}.{self.dataset}.{self.table}"

    @property
    def staging_table(self) -> str:
        return f"{self.project}.{self.dataset}.{self.table}__onceflow_stage_{self._digest('staging')}"

    def job_id(self, job: str, generation: int) -> str:
        """The BigQuery job id of `job` (`load` or `merge`) in generation `generation`: letters, digits, `_`, `-`."""
        slug = re.sub(r"[^A-Za-z0-9_-]", "-", f"{asset_key_part(self.asset)}_{self.window_key}_pane{self.pane}")
        return f"onceflow_{slug[:200]}_{job}_{self._digest(job)}_g{generation}"

    def _digest(self, job: str) -> str:
        identity = [self.asset, self.window_key, self.pane, job, self.final_table]
        return sha256_hex(json.dumps(identity).encode())[:16]

    def _schema(self) -> list[bigquery.SchemaField]:
        from google.cloud import bigquery

        return [bigquery.SchemaField(name, kind) for name, kind in self.schema]

    def verify(self, ctx: CommitContext) -> bool:
        from google.api_core.exceptions import NotFound

        sums = ", ".join(f"SUM(`{c}`) AS `sum_{i}`" for i, (c, _) in enumerate(self.expected_sums))
        sql = (
            f"SELECT `pane` AS `pane`, COUNT(*) AS `n`{', ' + sums if sums else ''} FROM `{self.final_table}` "
            f"WHERE `window_start` = TIMESTAMP_MILLIS({self.window_start_ms}) GROUP BY `pane`"
        )
        with ctx.bigquery_client(self.project) as client:
            try:
                panes = {row["pane"]: row for row in client.query_and_wait(sql, project=self.project)}
            except NotFound:
                return False
        if any(pane > self.pane for pane in panes):
            return True  # a newer pane replaced this one: this pane's publication is moot, not missing
        if self.expected_rows == 0:
            return not panes
        row = panes.get(self.pane)
        if row is None or len(panes) != 1 or row["n"] != self.expected_rows:
            return False
        return all(_same_sum(row[f"sum_{i}"], want) for i, (_, want) in enumerate(self.expected_sums))

    def execute(self, ctx: CommitContext) -> None:
        from google.cloud import bigquery

        payload = self._payload(ctx)
        with ctx.bigquery_client(self.project) as client:
            _create_table(client, self.final_table, self._schema())
            if payload:
                config = bigquery.LoadJobConfig(
                    source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
                    schema=self._schema(),
                    write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
                    create_disposition=bigquery.CreateDisposition.CREATE_IF_NEEDED,
                )

                self._run_job(
                    ctx,
                    client,
                    "load",
                    lambda job_id: client.load_table_from_file(
                        io.BytesIO(payload), self.staging_table, job_id=job_id, job_config=config,
                        project=self.project,
                    ),
                    # Its result is the staging table, unless that is gone because a runner merged and
                    # dropped it already (then the MERGE job's id finds that runner's job).
                    result_usable=lambda: _table_exists(client, self.staging_table) or self.verify(ctx),
                )
            else:
                _create_table(client, self.staging_table, self._schema())
            merge = self._merge_sql()
            self._run_job(
                ctx,
                client,
                "merge",
                lambda job_id: client.query(merge, job_id=job_id, job_retry=None, project=self.project),
            )
            _drop_table(client, self.staging_table)

    def _payload(self, ctx: CommitContext) -> bytes:
        sink = ctx.sink(self.files_root)
        parts = []
        for key, digest in self.files:
            data = sink.read(key)
            if data is None or sha256_hex(data) != digest:
                raise ValueError(f"{sink.url(key)} is missing or does not hold the bytes the sequence expects")
            if data and not data.endswith(b"\n"):
                data += b"\n"
            parts.append(data)
        return b"".join(parts)

    def _merge_sql(self) -> str:
        names = [name for name, _ in self.schema]
        window = f"TIMESTAMP_MILLIS({self.window_start_ms})"
        on = " AND ".join(f"t.`{c}` = s.`{c}`" for c in self.key_columns)
        update = ", ".join(f"`{c}` = s.`{c}`" for c in names)
        insert = ", ".join(f"`{c}`" for c in names)
        values = ", ".join(f"s.`{c}`" for c in names)
        return (
            f"MERGE `{self.final_table}` AS t "
            f"USING (SELECT * FROM `{self.staging_table}` WHERE {self.pane} >= "
            f"(SELECT COALESCE(MAX(`pane`), -1) FROM `{self.final_table}` WHERE `window_start` = {window})) AS s "
            f"ON {on} "
            f"WHEN MATCHED AND s.`pane` >= t.`pane` THEN UPDATE SET {update} "
            f"WHEN NOT MATCHED THEN INSERT ({insert}) VALUES ({values}) "
            f"WHEN NOT MATCHED BY SOURCE AND t.`window_start` = {window} AND t.`pane` <= {self.pane} THEN DELETE"
        )

    def _run_job(
        self,
        ctx: CommitContext,
        client: bigquery.Client,
        job: str,
        submit: Callable[[str], Any],
        result_usable: Callable[[], bool] = lambda: True,
    ) -> None:
        from google.api_core.exceptions import GoogleAPICallError, NotFound

        for generation in range(_MAX_GENERATIONS):
            job_id = self.job_id(job, generation)
            try:
                submitted = submit(job_id)
                found = None
            except GoogleAPICallError as error:
                # 409 from BigQuery; a racing duplicate may also get 400 from the emulator. Whatever the
                # answer, if a job with this id exists it was submitted before, and its result is what counts.
                try:
                    found = client.get_job(job_id, project=self.project, location=client.location)
                except NotFound:
                    raise error from None
                submitted = None
            current = submitted or found
            _wait(current, ctx.bigquery_timeout_s)
            if current.error_result is None:
                if submitted is not None or result_usable():
                    return
                continue  # an earlier attempt's result is gone: redo the job under the next generation
            if submitted is not None:
                raise RuntimeError(f"BigQuery {job} job {job_id} failed: {current.error_result}")
            # An earlier attempt's job failed, changing nothing: its id is spent, the next generation runs.
        raise RuntimeError(f"BigQuery {job} jobs of {self.describe()} failed {_MAX_GENERATIONS} times")


def _create_table(client: bigquery.Client, table_id: str, schema: list[bigquery.SchemaField]) -> None:
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud import bigquery

    try:
        client.create_table(bigquery.Table(table_id, schema=schema), exists_ok=True)
    except GoogleAPICallError as error:
        # A concurrent creator can make this call fail otherwise than with 409 (the emulator answers 400 when
        # two catalogue commits collide); what matters is that the table exists.
        if not _table_exists(client, table_id):
            raise error from None


def _drop_table(client: bigquery.Client, table_id: str) -> None:
    from google.api_core.exceptions import GoogleAPICallError

    try:
        client.delete_table(table_id, not_found_ok=True)
    except GoogleAPICallError as error:
        if _table_exists(client, table_id):  # as in `_create_table`: a concurrent runner may have dropped it
            raise error from None


def _table_exists(client: bigquery.Client, table_id: str) -> bool:
    from google.api_core.exceptions import NotFound

    try:
        client.get_table(table_id)
    except NotFound:
        return False
    return True


def _same_sum(found: Any, want: str | None) -> bool:
    # SUM over only NULLs is NULL in BigQuery, and so is the expected sum then.
    if found is None or want is None:
        return found is None and want is None
    return Decimal(str(found)) == Decimal(want)


def _wait(job: Any, timeout_s: float) -> None:
    """Wait until `job` is DONE, however it ended (its `error_result` says how)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    job.reload()
    while job.state != "DONE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"BigQuery job {job.job_id} not done after {timeout_s:.0f}s (state {job.state})")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
        job.reload()


# --- high watermark -------------------------------------------------------------------------------------------


@register_step
@dataclass(frozen=True)
class HighWatermark(CommitStep):
    """Record that `asset` is published through `published_through_ms` (the end of the newest published window).

    Kept in the commit store (`CommitStore.record_published`); the stored value only ever grows, so executing
    this after a later window was recorded changes nothing. Verified when the stored value is at least this one.
    """

    kind: ClassVar[str] = "high_watermark"
    asset: str
    published_through_ms: int

    def describe(self) -> str:
        return f"{self.kind} {self.asset} through {self.published_through_ms}"

    def verify(self, ctx: CommitContext) -> bool:
        stored = ctx.store.published_through(self.asset)
        return stored is not None and stored >= self.published_through_ms

    def execute(self, ctx: CommitContext) -> None:
        ctx.store.record_published(self.asset, self.published_through_ms)


# --- running --------------------------------------------------------------------------------------------------

Outcome = Literal["done", "already_done", "failed", "quarantined"]


class CommitFailed(RuntimeError):
    """A run's attempt at a commit sequence failed (see `CommitResult.raise_on_failure`)."""


@dataclass(frozen=True)
class CommitResult:
    """What one `run_sequence` call did.

    `outcome`: `done` (this call finished the sequence), `already_done` (nothing to do), `failed` (this attempt
    failed; the sequence stays pending for a later attempt) or `quarantined` (this attempt failed and used up the
    budget, or the sequence was quarantined already and nothing ran). `attempt` is the attempt number (None if
    no attempt was recorded); `executed` lists the steps this call executed, `verified` those it found already
    in effect; `error` is this attempt's error.
    """

    sequence_id: str
    outcome: Outcome
    attempt: int | None
    executed: tuple[int, ...] = ()
    verified: tuple[int, ...] = ()
    error: str | None = None

    def raise_on_failure(self) -> None:
        """Raise `CommitFailed` if this call's attempt failed: what makes a Dagster run fail (and be retried)."""
        if self.error is not None:
            raise CommitFailed(f"commit sequence {self.sequence_id} attempt {self.attempt}: {self.error}")


def run_sequence(ctx: CommitContext, sequence_id: str, run_id: str, root_run_id: str | None = None) -> CommitResult:
    """Drive sequence `sequence_id` to the end, as run `run_id` of the Dagster run lineage `root_run_id`.

    Records an attempt (a retry of a run, same `root_run_id`, continues its lineage's attempt), then for each
    step not yet recorded done: verify, or execute + crash point `commit.after_step` + verify, and record it
    done. A step error or a step that does not verify after executing fails the attempt: the error is recorded
    and, when the budget is used up, the sequence is quarantined. Safe to run concurrently with itself. Raises
    `KeyError` if there is no such sequence; errors of the commit store itself propagate (the attempt then stays
    without outcome, as if the process had died).
    """
    record = ctx.store.get(sequence_id)
    if record is None:
        raise KeyError(f"no commit sequence {sequence_id!r}")
    sequence = CommitSequence.from_record(record)
    try:
        attempt = ctx.store.start_attempt(sequence_id, run_id, root_run_id or run_id)
    except SequenceClosed as closed:
        return CommitResult(sequence_id, "already_done" if closed.status == DONE else QUARANTINED, None)

    executed: list[int] = []
    verified: list[int] = []
    statuses = ctx.store.state(sequence_id).steps
    for index, step in enumerate(sequence.steps):
        if statuses[index] == DONE:
            continue
        try:
            if step.verify(ctx):
                verified.append(index)
            else:
                step.execute(ctx)
                crash_point("commit.after_step")
                if not step.verify(ctx):
                    raise RuntimeError("executed, but its effect does not verify")
                executed.append(index)
        except Exception as error:
            message = f"step {index} ({step.describe()}): {type(error).__name__}: {error}"[:4000]
            state = ctx.store.finish_attempt(sequence_id, run_id, FAILED, message)
            outcome: Outcome = QUARANTINED if state.status == QUARANTINED else FAILED
            return CommitResult(sequence_id, outcome, attempt, tuple(executed), tuple(verified), message)
        ctx.store.mark_step_done(sequence_id, index)
    ctx.store.finish_attempt(sequence_id, run_id, DONE)
    return CommitResult(sequence_id, DONE, attempt, tuple(executed), tuple(verified))
