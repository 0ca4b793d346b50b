"""What onceflow writes to PostgreSQL (psycopg 3): a table's rows and a marker row per commit, in one transaction.

`PostgresTable.write` takes a transaction-scoped advisory lock on the commit, returns if the commit's marker is
there, else creates the table (or adds the columns it lacks: evolution is additive; a column whose type differs
is refused), copies the rows in with `COPY` and inserts the marker, and commits: the rows and the marker are
visible together or not at all, and two writers of one commit write it once. `mode="upsert"` copies into a
temporary table, then inserts on the key, the newest batch winning (`onceflow_batch`, a column of upsert tables;
within a batch, the newest `event_time`), so a late retry of an older batch never overwrites a newer row.
Markers live in `onceflow_commits`, in the table's schema.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.types.json import Jsonb
from pyarrow import csv

from onceflow.resources.faults import fault_point

if TYPE_CHECKING:
    from psycopg import Cursor

MARKERS = "onceflow_commits"
BATCH_COLUMN = "onceflow_batch"
APPLICATION = "onceflow-sink"  # the `application_name` of its connections, as `pg_stat_activity` shows them


class PostgresSchemaError(ValueError):
    """The table holds a column whose type is not the one the output gives it (evolution is additive only)."""


def column_type(data_type: pa.DataType) -> str:
    """The PostgreSQL column type of an Arrow type, as `format_type` spells it (so a table's types compare)."""
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "text"
    if pa.types.is_decimal(data_type):
        return f"numeric({data_type.precision},{data_type.scale})"
    if pa.types.is_timestamp(data_type):
        return "timestamp with time zone" if data_type.tz else "timestamp without time zone"
    simple = [(pa.types.is_boolean, "boolean"), (pa.types.is_int8, "smallint"), (pa.types.is_int16, "smallint"),
              (pa.types.is_int32, "integer"), (pa.types.is_int64, "bigint"), (pa.types.is_float32, "real"),
              (pa.types.is_float64, "double precision"), (pa.types.is_date, "date"), (pa.types.is_binary, "bytea")]
    for test, name in simple:
        if test(data_type):
            return name
    if pa.types.is_nested(data_type):
        return "jsonb"
    raise PostgresSchemaError(f"{data_type} has no PostgreSQL column type here")


class PostgresTable:
    """The table `table` (`name` or `schema.name`) of the database at `dsn`, written as described above; one
    connection, opened on first use and again after it breaks."""

    def __init__(self, dsn: str, table: str, mode: str = "append", key: Sequence[str] = ()) -> None:
        self._dsn, self.mode, self.key = dsn, mode, tuple(key)
        schema, _, name = table.rpartition(".")
        self.schema = schema or "public"
        self.table = sql.Identifier(self.schema, name)
        self.markers = sql.Identifier(self.schema, MARKERS)
        self.target = f"{self.schema}.{name}"
        self._connection: psycopg.Connection | None = None

    def committed(self, commit_id: str) -> bool:
        return self.rows_of(commit_id) is not None

    def rows_of(self, commit_id: str) -> int | None:
        """The rows the commit wrote, as its marker records them; None if it is not committed."""
        with self._reachable(), self._cursor() as cur:
            try:
                cur.execute(sql.SQL("SELECT rows FROM {} WHERE commit_id = %s AND target = %s").format(self.markers),
                            (commit_id, self.target))
            except psycopg.errors.UndefinedTable:
                return None
            found = cur.fetchone()
            return None if found is None else int(found[0])

    def write(self, rows: pa.Table, commit_id: str, batch: int) -> None:
        with self._reachable():
            connection = self._connect()
            with connection.transaction(), connection.cursor() as cur:
                self._ensure_tables(cur, rows.schema)
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"{self.target}/{commit_id}",))
                cur.execute(sql.SQL("SELECT 1 FROM {} WHERE commit_id = %s AND target = %s").format(self.markers),
                            (commit_id, self.target))
                if cur.fetchone() is not None:
                    return
                if self.mode == "upsert":
                    self._upsert(cur, rows, batch)
                else:
                    self._copy(cur, self.table, rows)
                cur.execute(sql.SQL("INSERT INTO {} (commit_id, target, rows) VALUES (%s, %s, %s)").format(
                    self.markers), (commit_id, self.target, rows.num_rows))
                fault_point("sink.postgres.before_commit")

    def close(self) -> None:
        if self._connection is not None:
            with suppress(psycopg.Error):
                self._connection.close()
            self._connection = None

    def _connect(self) -> psycopg.Connection:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self._dsn, autocommit=True, connect_timeout=10,
                                               application_name=APPLICATION)
        return self._connection

    def _cursor(self) -> Cursor:
        return self._connect().cursor()

    @contextmanager
    def _reachable(self) -> Iterator[None]:
        """A server that cannot be reached, or went away, is a `ConnectionError` (the attempt uses no budget); the
        broken connection is opened anew next time."""
        try:
            yield
        except psycopg.OperationalError as error:
            self.close()
            raise ConnectionError(f"PostgreSQL ({self.target}): {str(error).strip()}") from error

    def _ensure_tables(self, cur: Cursor, schema: pa.Schema) -> None:
        """Create the markers and the table if missing, add the columns the table lacks; refuse a changed type.
        Under a lock on the table's name: two first writers at once would both try to create it."""
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"{self.target}/ddl",))
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (commit_id text NOT NULL, target text NOT NULL, rows "
                            "bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY "
                            "(commit_id, target))").format(self.markers))
        wanted = {f.name: column_type(f.type) for f in schema}
        if self.mode == "upsert":
            wanted[BATCH_COLUMN] = "bigint"
        cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a WHERE a.attrelid = "
                    "to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
                    (sql.Identifier(*self.target.split(".")).as_string(cur),))
        held = dict(cur.fetchall())
        if not held:
            columns = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in wanted.items()]
            if self.mode == "upsert":
                columns.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.key))))
            cur.execute(sql.SQL("CREATE TABLE {} ({})").format(self.table, sql.SQL(", ").join(columns)))
            return
        changed = [f"{n} is {held[n]}, the output gives {t}" for n, t in wanted.items() if n in held and held[n] != t]
        if changed:
            raise PostgresSchemaError(f"{self.target}: " + "; ".join(changed) + " (columns are only ever added)")
        for name, kind in wanted.items():
            if name not in held:
                cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(self.table, sql.Identifier(name),
                                                                                 sql.SQL(kind)))

    def _copy(self, cur: Cursor, table: sql.Composable, rows: pa.Table, extra: dict[str, int] | None = None) -> None:
        for name, value in (extra or {}).items():
            rows = rows.append_column(name, pa.array([value] * rows.num_rows, pa.int64()))
        columns = sql.SQL(", ").join(map(sql.Identifier, rows.column_names))
        if not any(pa.types.is_nested(f.type) or pa.types.is_binary(f.type) for f in rows.schema):
            # CSV made by Arrow in C, every value quoted and NULL left empty: what COPY's CSV format reads back
            # exactly (a quoted "" is an empty string), at a small part of the cost of a row at a time.
            data = io.BytesIO()
            csv.write_csv(rows, data, csv.WriteOptions(include_header=False, quoting_style="all_valid"))
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(table, columns)) as copy:
                copy.write(data.getbuffer())
            return
        nested = {f.name for f in rows.schema if pa.types.is_nested(f.type)}
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, columns)) as copy:
            for row in rows.to_pylist():
                copy.write_row(tuple(Jsonb(v) if k in nested and v is not None else v for k, v in row.items()))

    def _upsert(self, cur: Cursor, rows: pa.Table, batch: int) -> None:
        stage = sql.Identifier("onceflow_stage")
        cur.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP").format(stage, self.table))
        self._copy(cur, stage, rows, {BATCH_COLUMN: batch})
        names = [*rows.column_names, BATCH_COLUMN]
        keys = sql.SQL(", ").join(map(sql.Identifier, self.key))
        newest = [sql.SQL("{} DESC NULLS LAST").format(sql.Identifier(c)) for c in ("event_time", "record_id")
                  if c in rows.column_names]
        cur.execute(sql.SQL(
            "INSERT INTO {table} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {stage} ORDER BY {order} "
            "ON CONFLICT ({keys}) DO UPDATE SET {sets} WHERE {table}.{batch} <= EXCLUDED.{batch}"
        ).format(
            table=self.table, cols=sql.SQL(", ").join(map(sql.Identifier, names)), keys=keys, stage=stage,
            order=sql.SQL(", ").join([*map(sql.Identifier, self.key), *newest]),
            sets=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in names
                                    if n not in self.key),
            batch=sql.Identifier(BATCH_COLUMN),
        ))
