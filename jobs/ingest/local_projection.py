"""A DataFrame's projection evaluated on a classic session's driver over an Arrow table, without a Spark job.

For a few rows through large expressions, the job is nearly all overhead: analysing and optimizing the
expressions again, planning, scheduling. `LocalProjection` (Java, beside this file) does the analysis and the
optimization once, on a template, and then evaluates the optimized expressions row by row with Spark's own
interpreted evaluation: the same expressions, with the same semantics, that the job would run. A Spark Connect
server that onceflow started does the same on its driver for a client's projection (`evaluated_on_driver`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import types as T

_MICROS = pa.timestamp("us", tz="UTC")
PROJECTION_TYPE = "type.googleapis.com/io.onceflow.LocalProjection"
"""The relation extension's type that `ProjectionPlugin.java` evaluates."""


class LocalProjection:
    """`columns` (STRING, TIMESTAMP or BIGINT each) selected from rows of `schema` (columns of those types), to
    evaluate on the driver of the classic session `spark` over tables of that schema."""

    def __init__(self, spark: SparkSession, schema: T.StructType, columns: tuple[Column, ...]) -> None:
        # Over rows Spark cannot see (an empty RDD), the optimizer keeps the projection instead of evaluating it.
        template = spark.createDataFrame(spark.sparkContext.emptyRDD(), schema).select(*columns)
        self._java = spark._jvm.io.onceflow.LocalProjection(template._jdf)
        self._output = [(f.name, f.dataType.simpleString()) for f in template.schema]

    def __call__(self, table: pa.Table) -> pa.Table:
        """The projection of `table` (the input's columns, in order), one row for each of its rows."""
        columns = [_plain(column) for column in table.columns]
        parts = self._java.apply(json.dumps(columns))  # each small enough for one Py4J reply without a stall
        out = json.loads("".join(parts[i] for i in range(len(parts))))
        return pa.table({name: _arrow(values, kind) for (name, kind), values in zip(self._output, out, strict=True)})


def on_driver(projected: DataFrame) -> DataFrame:
    """`projected`, a Spark Connect client's projection of rows it holds (`createDataFrame(table).select(...)`), to
    be evaluated by the server's `ProjectionPlugin` (Java, beside this file) as `LocalProjection` evaluates one: no
    Spark job, and its expressions analysed once per session. Only for a server onceflow started
    (`onceflow.resources.spark_functions.compiled_functions`); its rows are the plain DataFrame's. The server's
    answer is a local relation of those rows; any other input is planned as Spark plans it."""
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame

    return ConnectDataFrame(_extension_plan()(projected._plan), projected.sparkSession)


def evaluated_on_driver(projected: DataFrame) -> pa.Table:
    """The rows of `on_driver(projected)`, in the server's Arrow types (a TIMESTAMP in the session's zone)."""
    # One request: `toArrow` would first ask the server for the schema, which evaluates the projection twice.
    table, _ = on_driver(projected)._to_table()
    return table


@functools.cache
def _extension_plan() -> type:
    """The Connect plan that wraps a projection in the relation extension, made once (a classic-only process
    never imports Spark Connect's client)."""
    from pyspark.sql.connect.plan import LogicalPlan

    class ProjectionExtension(LogicalPlan):
        def __init__(self, projected: LogicalPlan) -> None:
            super().__init__(None)
            self._projected = projected

        def plan(self, session: Any) -> Any:  # pyspark's own signature (a client, a relation)
            relation = self._create_proto_relation()
            relation.extension.type_url = PROJECTION_TYPE
            relation.extension.value = self._projected.plan(session).SerializeToString()
            return relation

    return ProjectionExtension


def _plain(column: pa.ChunkedArray) -> list:
    if pa.types.is_timestamp(column.type):  # as the microseconds a TIMESTAMP holds
        return column.cast(_MICROS).cast(pa.int64()).to_pylist()
    return column.to_pylist()


def _arrow(values: list, kind: str) -> pa.Array:
    if kind == "timestamp":
        return pa.array(values, pa.int64()).cast(_MICROS)
    return pa.array(values, pa.int64() if kind == "bigint" else pa.string())
