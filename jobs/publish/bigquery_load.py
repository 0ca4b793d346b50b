"""The commit step `BigQueryLoad`: a window's rows in a BigQuery table replaced by one pane's, through
deterministic job ids, so a retried or concurrent load has the effect of one."""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

from onceflow.jobs.publish.commit_records import asset_key_part
from onceflow.jobs.publish.sink_types import bigquery_field, parse_sink_type
from onceflow.jobs.publish.step import CommitContext, CommitStep, sha256_hex
from onceflow.resources.bigquery_jobs import create_table, drop_table, evolve_table, run_job, table_exists

if TYPE_CHECKING:
    from google.cloud import bigquery

SUMMABLE_TYPES = frozenset({"INT64", "INTEGER", "NUMERIC", "BIGNUMERIC"})
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,299}$")
_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,127}$")


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

    Job ids are a pure function of (asset, window, pane, job, target table) plus a generation
    (`onceflow.resources.bigquery_jobs.run_job`): a load whose result is gone (the staging table was dropped)
    runs again under the next generation. Both jobs are idempotent in effect
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
            create_table(client, self.final_table, self._schema())
            evolve_table(client, self.final_table, self._schema())
            if payload:
                config = bigquery.LoadJobConfig(
                    source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
                    schema=self._schema(),
                    write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
                    create_disposition=bigquery.CreateDisposition.CREATE_IF_NEEDED,
                )

                run_job(
                    client, self.project, "load", lambda g: self.job_id("load", g),
                    lambda job_id: client.load_table_from_file(
                        io.BytesIO(payload), self.staging_table, job_id=job_id, job_config=config,
                        project=self.project,
                    ),
                    ctx.bigquery_timeout_s,
                    # Its result is the staging table, unless that is gone because a runner merged and
                    # dropped it already (then the MERGE job's id finds that runner's job).
                    result_usable=lambda: table_exists(client, self.staging_table) or self.verify(ctx),
                )
            else:
                create_table(client, self.staging_table, self._schema())
            merge = self._merge_sql()
            run_job(client, self.project, "merge", lambda g: self.job_id("merge", g),
                    lambda job_id: client.query(merge, job_id=job_id, job_retry=None, project=self.project),
                    ctx.bigquery_timeout_s)
            drop_table(client, self.staging_table)

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


def _same_sum(found: Any, want: str | None) -> bool:
    # SUM over only NULLs is NULL in BigQuery, and so is the expected sum then.
    if found is None or want is None:
        return found is None and want is None
    return Decimal(str(found)) == Decimal(want)

