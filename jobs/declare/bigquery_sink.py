"""`BigQuerySink`: a BigQuery table that a record output inserts each batch's rows into
(`onceflow.resources.bigquery_records`), or that a windowed output's final panes replace their window's rows in
(`onceflow.jobs.publish.bigquery_load`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onceflow.jobs.declare.errors import DeclarationError
from onceflow.jobs.declare.sink import Commit, Sink, record_json

if TYPE_CHECKING:
    import pyarrow as pa

    from onceflow.resources.bigquery_records import BigQueryRecordTable

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,1023}$")
_PROJECT = re.compile(r"^(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")  # optionally domain-scoped


@dataclass(frozen=True, kw_only=True)
class BigQuerySink(Sink):
    """The BigQuery table `table` (dataset default: `ONCEFLOW_BIGQUERY_DATASET`; project default:
    `ONCEFLOW_BIGQUERY_PROJECT`, else the one Application Default Credentials name).

    `table` may name its dataset and project as BigQuery writes them: `"dataset.table"`, `"project.dataset.table"`.
    In a record output, each batch's rows are inserted with a marker row in `<dataset>.onceflow_commits`, in one
    transaction; the table is created from the output's types and gains the columns it lacks. Credentials come
    from ADC; `api_endpoint` (default: `BIGQUERY_EMULATOR_HOST` under the local deployment) points at an emulator.
    """

    table: str
    dataset: str | None = None
    project: str | None = None
    location: str | None = None
    api_endpoint: str | None = None
    _client: BigQueryRecordTable | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.table, str) or "." not in self.table:
            return
        *qualifiers, table = self.table.rsplit(".", 2)
        named = dict(zip(("project", "dataset")[-len(qualifiers):], qualifiers, strict=True))
        for name, value in named.items():
            given = getattr(self, name)
            if given is not None and given != value:
                raise DeclarationError(f"BigQuerySink: table {self.table!r} names {name} {value!r}, but {name}="
                                       f"{given!r} is given too: name it once")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "table", table)

    @property
    def name(self) -> str:
        return f"bigquery:{self.dataset}.{self.table}" if self.dataset else f"bigquery:{self.table}"

    def problems(self) -> list[str]:
        found = [f"{name} {value!r} is not a BigQuery name" for name in ("table", "dataset")
                 if (value := getattr(self, name)) is not None and (not isinstance(value, str) or not _NAME.match(value))]
        if self.project is not None and not _PROJECT.match(str(self.project)):
            found.append(f"project {self.project!r} is not a Google Cloud project id")
        return found

    def write(self, rows: pa.Table, commit: Commit) -> None:
        from onceflow.resources.bigquery_records import bigquery_fields

        payload = "".join(record_json(row) + "\n" for row in rows.to_pylist()).encode()
        self._table().write(payload, bigquery_fields(rows.schema), commit.id)

    def committed(self, commit: Commit) -> bool:
        return self._table().committed(commit.id)

    def rows(self, commit: Commit) -> int | None:
        return self._table().rows_of(commit.id)

    def close(self) -> None:
        object.__setattr__(self, "_client", None)

    def _table(self) -> BigQueryRecordTable:
        client = self._client
        if client is None:
            from onceflow.resources.bigquery import BigQueryResource
            from onceflow.resources.bigquery_records import BigQueryRecordTable

            if self.dataset is None:
                raise ValueError(f"{self.name}: no dataset (declare dataset=... or set ONCEFLOW_BIGQUERY_DATASET)")
            clients = BigQueryResource(project=self.project, location=self.location, api_endpoint=self.api_endpoint)
            with clients.get_client() as probe:
                project = self.project or probe.project
            client = BigQueryRecordTable(clients, project, self.dataset, self.table)
            object.__setattr__(self, "_client", client)
        return client
