"""The commit step `BigQueryLoad`: a window's rows in a BigQuery table replaced by one pane's, through
deterministic job ids, so a retried or concurrent load has the effect of one."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

from onceflow.jobs.publish.commit_records import asset_key_part
from onceflow.jobs.publish.sink_types import bigquery_field, parse_sink_type
from onceflow.jobs.publish.step import CommitContext, CommitStep, sha256_hex

if TYPE_CHECKING:
    from google.cloud import bigquery

SUMMABLE_TYPES = frozenset({"INT64", "INTEGER", "NUMERIC", "BIGNUMERIC"})
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,299}$")
_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,127}$")
_MAX_GENERATIONS = 100


@dataclass(frozen=True)
class BigQueryLoad(CommitStep):
    """Make the BigQuery table `project.dataset.table` hold exactly pane `pane`'s rows for one window.

    The rows are the newline-delimited JSON files `files` ((key, sha256) pairs under `files_root`, normally the
    finalized shards of the file sink), with columns `schema` ((name, sink type) pairs, see `onceflow.jobs.publish.sink_types`;
    `window_start` TIMESTAMP and `pane` INT64 among them). `execute`:

    1. creates the table if it does not exist (the dataset must exist), and adds the columns it lacks (NULLABLE;
       a column it holds under another type stops the step, naming it);
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
            if not _COLUMN.match(name):
                raise ValueError(f"invalid BigQuery column {name!r} {kind!r}")
            bigquery_field(name, parse_sink_type(kind))
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
        return [bigquery_field(name, parse_sink_type(kind)) for name, kind in self.schema]

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
            evolve_table(client, self.final_table, self._schema())
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


class BigQueryTypeChanged(RuntimeError):
    """A BigQuery table holds a column under another type than the output now gives it."""


def evolve_table(client: bigquery.Client, table_id: str, schema: list[bigquery.SchemaField]) -> None:
    """Add to the table the columns of `schema` it lacks, NULLABLE (rows loaded before hold NULL there), as the
    Delta tables evolve; a column it holds under another type is `BigQueryTypeChanged`, naming it and the way out."""
    table = client.get_table(table_id)
    held = {field.name.lower(): field for field in table.schema}
    for field in schema:
        found = held.get(field.name.lower())
        if found is not None and _kind(found) != _kind(field):
            raise BigQueryTypeChanged(
                f"BigQuery table {table_id}: column {field.name!r} is {_kind(found)}, the output now gives "
                f"{_kind(field)}; BigQuery cannot change it in place: publish the output to a new table (or "
                "drop this one), or give the column its old type in the transform"
            )
    added = [field for field in schema if field.name.lower() not in held]
    if added:
        from google.cloud import bigquery

        table.schema = [*table.schema, *(bigquery.SchemaField(f.name, f.field_type, mode="NULLABLE",
                                                              fields=f.fields) for f in added)]
        client.update_table(table, ["schema"])


_STANDARD = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL", "RECORD": "STRUCT"}


def _kind(field: bigquery.SchemaField) -> str:
    """A field's type by its standard SQL name (the API answers with legacy ones), and its mode if repeated."""
    kind = _STANDARD.get(field.field_type, field.field_type)
    return f"ARRAY<{kind}>" if field.mode == "REPEATED" else kind


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
    """Wait until `job` is DONE, however it ended: a failed job is an answer here (its `error_result` says how),
    not an exception."""
    from google.api_core.exceptions import GoogleAPICallError

    deadline = time.monotonic() + timeout_s
    try:
        job.result(timeout=timeout_s)
    except GoogleAPICallError:
        # The error may come from the results call (jobs.getQueryResults) of a query that failed, before the
        # job's own status was read: its `error_result` is only an answer once jobs.get says DONE.
        while job.state != "DONE" and time.monotonic() < deadline:
            job.reload()
            if job.state != "DONE":
                time.sleep(0.1)
    except TimeoutError:
        pass
    if job.state != "DONE":
        raise TimeoutError(f"BigQuery job {job.job_id} not done after {timeout_s:.0f}s (state {job.state})")
