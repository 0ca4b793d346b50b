"""A batch's own numbers (its id, its time, its horizon floor) as columns of every one of its rows."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def with_batch_values(df: DataFrame, **values: int) -> DataFrame:
    """`df` with one BIGINT column per keyword, the same value on every row.

    The values come from a one-row table joined to the batch, not from literals: Spark compiles literals into the
    code it generates for a plan, so a plan holding this batch's numbers would be compiled anew for every batch
    (a fixed cost per batch, large beside a small batch's work), while a plan that reads them from a joined row
    generates the same code each batch and reuses it.
    """
    row = ", ".join(f"{int(value)}L" for value in values.values())  # int(): only numbers enter the SQL text
    batch = df.sparkSession.sql(f"SELECT * FROM VALUES ({row}) AS batch({', '.join(values)})")
    return df.crossJoin(F.broadcast(batch))
