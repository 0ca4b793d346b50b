"""`BigQuerySink`: a BigQuery table a windowed output's final panes replace their window's rows in
(`onceflow.jobs.publish.bigquery_load`)."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.jobs.declare.errors import DeclarationError


@dataclass(frozen=True, kw_only=True)
class BigQuerySink:
    """Publish each final pane into the BigQuery table `table` (dataset default: `ONCEFLOW_BIGQUERY_DATASET`).

    `table` may name its dataset and project as BigQuery writes them: `"dataset.table"`, `"project.dataset.table"`.
    """

    table: str
    dataset: str | None = None
    project: str | None = None

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
