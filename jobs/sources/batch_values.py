"""A batch's own values (its id, its time, its horizon floor, the files it reads) in the plan of the batch."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow.jobs.declare.schema import sql_string, sql_strings
from onceflow.resources.spark_functions import compiled_functions


def batch_value(spark: SparkSession, name: str, value: int | Sequence[str]) -> str:
    """SQL for the batch's `value` (a BIGINT, or an ARRAY<STRING>) named `name`.

    Where the session has onceflow's compiled functions (`onceflow.resources.spark_functions.compiled_functions`)
    it is `onceflow_batch_value` (`BatchValue.java`): the generated code reads it as a reference, not as a literal
    compiled into it, so a plan compiled for one batch serves the next; and a `PlanTemplate` binds it to each
    batch's value. Elsewhere (a Spark Connect server onceflow did not start) it is a literal.
    """
    literal = f"{int(value)}L" if isinstance(value, int) else sql_strings(value)  # int(): only numbers, as numbers
    if compiled_functions(spark):
        return f"onceflow_batch_value({sql_string(name)}, {literal})"
    return literal


def with_batch_values(df: DataFrame, **values: int) -> DataFrame:
    """`df` with one BIGINT column per keyword, the same value on every row.

    The values are never BIGINT literals: Spark compiles those into the code it generates for a plan, so a plan
    holding this batch's numbers would be compiled anew for every batch (a fixed cost per batch, large beside a
    small batch's work). They are `batch_value`s where the session has onceflow's compiled functions; elsewhere they
    come from a one-row table joined to the batch (whose broadcast is a small Spark job of its own).
    """
    spark = df.sparkSession
    if compiled_functions(spark):
        return df.selectExpr("*", *(f"{batch_value(spark, name, value)} AS {name}" for name, value in values.items()))
    row = ", ".join(f"{int(value)}L" for value in values.values())
    batch = spark.sql(f"SELECT * FROM VALUES ({row}) AS batch({', '.join(values)})")
    return df.crossJoin(F.broadcast(batch))
