"""`PostgresSink`: a record output's rows in a PostgreSQL table, each commit's rows and its marker in one
transaction (`onceflow.resources.postgres`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from onceflow.jobs.declare.sink import Commit, Sink

if TYPE_CHECKING:
    import pyarrow as pa

    from onceflow.resources.postgres import PostgresTable

PostgresMode = Literal["append", "upsert"]
POSTGRES_MODES: tuple[str, ...] = get_args(PostgresMode)
_TABLE = re.compile(r"^(?:[a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True, kw_only=True)
class PostgresSink(Sink):
    """The table `table` (`name` or `schema.name`, created from the output's types if missing, its columns added
    as the output gains them) of the database at `dsn` (a libpq connection string or URL; give a secret as
    `dg.EnvVar("NAME")`, read from the environment when the sink connects, never logged).

    `mode="append"` inserts every record; `mode="upsert"` keeps one row per `key` (its primary key), the newest
    batch's (then the newest `event_time`) winning, in a table with an `onceflow_batch` column.
    """

    dsn: Any = field(repr=False)
    table: str
    mode: PostgresMode = "append"
    key: Sequence[str] = ()
    _client: PostgresTable | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.key,) if isinstance(self.key, str) else tuple(self.key))

    @property
    def name(self) -> str:
        return f"postgres:{self.table}"

    def write(self, rows: pa.Table, commit: Commit) -> None:
        self._table().write(rows, commit.id, commit.batch)

    def committed(self, commit: Commit) -> bool:
        return self._table().committed(commit.id)

    def rows(self, commit: Commit) -> int | None:
        return self._table().rows_of(commit.id)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.table, str) or not _TABLE.match(self.table):
            found.append(f"table {self.table!r}: a lowercase name, or schema.name")
        if self.mode not in POSTGRES_MODES:
            found.append(f"mode {self.mode!r}: use {' or '.join(map(repr, POSTGRES_MODES))}")
        if self.mode == "upsert" and not self.key:
            found.append("mode 'upsert' needs key=[...]: the columns a row is kept by")
        found += [f"key {k!r} is not a column name" for k in self.key if not isinstance(k, str) or not _COLUMN.match(k)]
        if not isinstance(self.dsn, str) and not hasattr(self.dsn, "get_value"):
            found.append("dsn: give a connection string or dg.EnvVar('NAME')")
        return found

    def _table(self) -> PostgresTable:
        client = self._client
        if client is None:
            from onceflow.resources.postgres import PostgresTable

            dsn = self.dsn.get_value() if hasattr(self.dsn, "get_value") else self.dsn
            if not dsn:
                raise ValueError(f"{self.name}: its dsn is empty (is the environment variable set?)")
            client = PostgresTable(dsn, self.table, self.mode, self.key)
            object.__setattr__(self, "_client", client)
        return client
