"""The tables as reconciliation reads them: with delta-rs (a second engine, not Spark), times as epoch ms.

Delta keeps timestamps in microseconds, and other writers' files may hold nanoseconds: every precision is read,
and a time is floored to its millisecond (as onceflow's windows floor it), never refused for the digits it has.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import TableNotFoundError

from onceflow.jobs.verify.id_accounting import ids
from onceflow.resources.delta_storage import delta_table

_PER_MS = {"ms": 1, "us": 1000, "ns": 1_000_000}


def exists(path: str) -> bool:
    try:
        delta_table(path)
    except TableNotFoundError:
        return False
    return True


def epoch_ms(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A timestamp column (any unit, any zone) as int64 epoch milliseconds, floored; nulls stay null."""
    unit = column.type.unit
    ticks = pc.cast(column, pa.int64())
    if unit == "s":
        return pc.multiply(ticks, 1000)
    per = _PER_MS[unit]
    if per == 1:
        return ticks
    quotient = pc.divide(ticks, per)  # truncated toward zero: one less where a time before 1970 had a remainder
    short = pc.and_(pc.less(ticks, 0), pc.not_equal(pc.multiply(quotient, per), ticks))
    return pc.if_else(short, pc.subtract(quotient, 1), quotient)


def epoch_ms_columns(path: str, columns: list[str]) -> pa.Table:
    """Columns of a table read with delta-rs (none when it does not exist); timestamps as epoch milliseconds."""
    if not exists(path):
        return pa.table({name: pa.array([], pa.int64()) for name in columns})
    table = delta_table(path).to_pyarrow_table(columns=columns)
    for i, name in enumerate(columns):
        if pa.types.is_timestamp(table.column(name).type):
            table = table.set_column(i, name, epoch_ms(table.column(name)))
    return table


def table_ids(path: str) -> pa.Array:
    return ids(epoch_ms_columns(path, ["record_id"]).column("record_id"))
