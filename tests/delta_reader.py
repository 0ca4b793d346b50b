"""Read Delta tables with delta-rs: a second engine, so Spark never vouches for its own output. Paths may be local
or `gs://` (on the GCS emulator that `STORAGE_EMULATOR_HOST` names)."""

from __future__ import annotations

from typing import Any

from onceflow.resources.delta_storage import delta_table


def read_rows(path: str, columns: list[str], version: int | None = None) -> list[tuple[Any, ...]]:
    """The table's rows as sorted tuples of the given columns."""
    table = delta_table(path, version=version).to_pyarrow_table(columns=columns)
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def transaction_version(path: str, app_id: str) -> int | None:
    """The SetTransaction version Delta recorded for `app_id`, read from the log by delta-rs."""
    return delta_table(path).transaction_version(app_id)


def table_version(path: str) -> int:
    return delta_table(path).version()
