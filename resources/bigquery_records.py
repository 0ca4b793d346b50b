"""What onceflow writes to BigQuery for a record output: a commit's rows and its marker row in one transaction.

`BigQueryRecordTable.write` loads the commit's rows (newline-delimited JSON) into a staging table of the commit's
own (`<table>__onceflow_rows_<digest>`, one load job; a staging table per commit keeps BigQuery's per-table daily
limit on load jobs away from the table itself), then runs one multi-statement transaction that inserts them into
the table and a marker row into `<dataset>.onceflow_commits`, and drops the staging table. Both jobs run under ids
derived from the commit (`onceflow.resources.bigquery_jobs`), so a retried or concurrent write runs each once, and
the transaction commits the rows and the marker together or neither. The table is created from the rows' types,
its missing columns added (NULLABLE); a column whose type differs is refused.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa

from onceflow.resources.bigquery import BigQueryResource
from onceflow.resources.bigquery_jobs import create_table, drop_table, evolve_table, run_job, table_exists
from onceflow.resources.faults import fault_point

if TYPE_CHECKING:
    from google.cloud import bigquery

MARKERS = "onceflow_commits"
_COMMIT_ID = re.compile(r"^[A-Za-z0-9_./:-]{1,900}$")


class BigQuerySchemaError(ValueError):
    """The output gives a column type BigQuery cannot hold as it is (a map, an array of arrays)."""


def bigquery_fields(schema: pa.Schema) -> list[bigquery.SchemaField]:
    """The BigQuery columns of an Arrow schema (as the sink's JSON form of the values loads into them)."""
    return [_field(f.name, f.type) for f in schema]


def _field(name: str, data_type: pa.DataType, mode: str = "NULLABLE") -> bigquery.SchemaField:
    from google.cloud import bigquery

    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        if mode == "REPEATED" or pa.types.is_list(data_type.value_type) or pa.types.is_large_list(data_type.value_type):
            raise BigQuerySchemaError(f"column {name!r} ({data_type}): BigQuery arrays cannot hold arrays")
        return _field(name, data_type.value_type, "REPEATED")
    if pa.types.is_struct(data_type):
        return bigquery.SchemaField(name, "RECORD", mode=mode,
                                    fields=[_field(f.name, f.type) for f in data_type])
    return bigquery.SchemaField(name, _scalar(name, data_type), mode=mode)


def _scalar(name: str, t: pa.DataType) -> str:
    if pa.types.is_decimal(t):
        return "NUMERIC" if t.scale <= 9 and t.precision - t.scale <= 29 else "BIGNUMERIC"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz is not None else "DATETIME"
    kinds = [(pa.types.is_string, "STRING"), (pa.types.is_large_string, "STRING"), (pa.types.is_boolean, "BOOL"),
             (pa.types.is_signed_integer, "INT64"), (lambda t: t in (pa.uint8(), pa.uint16(), pa.uint32()), "INT64"),
             (pa.types.is_floating, "FLOAT64"), (pa.types.is_date, "DATE"), (pa.types.is_binary, "BYTES"),
             (pa.types.is_large_binary, "BYTES")]
    for test, kind in kinds:
        if test(t):
            return kind
    raise BigQuerySchemaError(f"column {name!r} ({t}) has no BigQuery type here: convert it in the transform "
                              "(a map to_json, for one)")


class BigQueryRecordTable:
    """The table `project.dataset.table`, written as the module docstring says, through clients of `clients`."""

    def __init__(self, clients: BigQueryResource, project: str, dataset: str, table: str,
                 timeout_s: float = 600.0) -> None:
        self.clients, self.timeout_s = clients, timeout_s
        self.project, self.dataset = project, dataset
        self.target = f"{project}.{dataset}.{table}"
        self.markers = f"{project}.{dataset}.{MARKERS}"

    def committed(self, commit_id: str) -> bool:
        return self.rows_of(commit_id) is not None

    def rows_of(self, commit_id: str) -> int | None:
        """The rows the commit inserted, as its marker records them; None if it is not committed."""
        from google.api_core.exceptions import NotFound

        sql = f"SELECT `rows` FROM `{self.markers}` WHERE `commit_id` = {_literal(commit_id)} AND `target` = " \
              f"{_literal(self.target)}"
        with self._client() as client:
            try:
                found = list(client.query_and_wait(sql, project=self.project))
            except NotFound:
                return None
        return None if not found else int(found[0]["rows"])

    def write(self, payload: bytes, schema: list[bigquery.SchemaField], commit_id: str) -> None:
        """Insert the rows `payload` (newline-delimited JSON of columns `schema`) as `commit_id`, once."""
        from google.cloud import bigquery

        if self.committed(commit_id):
            return
        staging = f"{self.target}__onceflow_rows_{_digest(self.target, commit_id)}"
        with self._client() as client:
            create_table(client, self.target, schema)
            evolve_table(client, self.target, schema)
            create_table(client, self.markers, _marker_schema())
            config = bigquery.LoadJobConfig(
                source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON, schema=schema,
                write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
                create_disposition=bigquery.CreateDisposition.CREATE_IF_NEEDED,
            )
            if not payload:
                create_table(client, staging, schema)
            else:
                run_job(client, self.project, "load", lambda g: self._job_id(commit_id, "load", g),
                        lambda job_id: client.load_table_from_file(io.BytesIO(payload), staging, job_id=job_id,
                                                                   job_config=config, project=self.project),
                        self.timeout_s,
                        # A load done whose staging table is gone was followed by the insert (it drops it last).
                        result_usable=lambda: table_exists(client, staging) or self.committed(commit_id))
            if self.committed(commit_id):
                return
            fault_point("sink.bigquery.before_commit")
            insert = self._transaction(schema, staging, commit_id)
            run_job(client, self.project, "insert", lambda g: self._job_id(commit_id, "insert", g),
                    lambda job_id: client.query(insert, job_id=job_id, job_retry=None, project=self.project),
                    self.timeout_s)
            drop_table(client, staging)

    def _transaction(self, schema: list[bigquery.SchemaField], staging: str, commit_id: str) -> str:
        columns = ", ".join(f"`{f.name}`" for f in schema)
        absent = (f"NOT EXISTS (SELECT 1 FROM `{self.markers}` WHERE `commit_id` = {_literal(commit_id)} "
                  f"AND `target` = {_literal(self.target)})")
        # The marker's guard makes even a transaction that ran twice (its job history gone) insert the rows once.
        return (
            "BEGIN TRANSACTION; "
            f"INSERT INTO `{self.target}` ({columns}) SELECT {columns} FROM `{staging}` WHERE {absent}; "
            f"INSERT INTO `{self.markers}` (`commit_id`, `target`, `rows`, `committed_at`) "
            f"SELECT {_literal(commit_id)}, {_literal(self.target)}, (SELECT COUNT(*) FROM `{staging}`), "
            f"CURRENT_TIMESTAMP() FROM (SELECT 1) WHERE {absent}; "
            "COMMIT TRANSACTION;"
        )

    def _job_id(self, commit_id: str, job: str, generation: int) -> str:
        slug = re.sub(r"[^A-Za-z0-9_-]", "-", commit_id)[:180]
        return f"onceflow_rows_{slug}_{job}_{_digest(self.target, commit_id, job)}_g{generation}"

    @contextmanager
    def _client(self) -> Iterator[bigquery.Client]:
        """A client; BigQuery out of reach (refused, unavailable, retries spent) is a `ConnectionError`, which
        uses none of the sequence's attempts."""
        from google.api_core.exceptions import RetryError, ServiceUnavailable
        from requests.exceptions import ConnectionError as RequestsConnectionError

        try:
            with self.clients.get_client() as client:
                yield client
        except (RequestsConnectionError, ServiceUnavailable, RetryError) as error:
            raise ConnectionError(f"BigQuery ({self.target}): {error}") from error


def _marker_schema() -> list[bigquery.SchemaField]:
    from google.cloud import bigquery

    return [bigquery.SchemaField("commit_id", "STRING", mode="REQUIRED"),
            bigquery.SchemaField("target", "STRING", mode="REQUIRED"),
            bigquery.SchemaField("rows", "INT64", mode="REQUIRED"),
            bigquery.SchemaField("committed_at", "TIMESTAMP")]


def _literal(value: str) -> str:
    """A string as a GoogleSQL literal; only commit ids and table names (checked names) reach it."""
    if not _COMMIT_ID.match(value):
        raise ValueError(f"{value!r} is not a commit id or table name onceflow writes")
    return f"'{value}'"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
