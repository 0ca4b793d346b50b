"""A batch's plan analysed once per pipeline and bound to each batch's rows (classic sessions).

Spark analyses a DataFrame as it is built: every projection's expressions are resolved, type-checked and coerced.
A realistic pipeline's validation is large, and analysing it again for each batch cost a tenth of a second of a
one-second batch, on the driver, while the executors waited. Structured Streaming analyses its query once and
replaces its sources' leaves each micro-batch; `PlanTemplate` (Java, beside this file) does the same for a batch's
plan. Over Spark Connect the plan is analysed by the server, and is built per batch as it always was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

BatchValues = Mapping[str, int | Sequence[str]]
"""A batch's own values by name: BIGINTs, or ARRAY<STRING>s (the files a batch reads)."""


class PlanTemplate:
    """The DataFrame `build(rows, values)` makes of a batch's rows (of `schema`) and its `values`, analysed once in
    the classic session `spark` with the values `placeholders` (of the types every batch's will have).

    `build` must make each value through `onceflow.jobs.sources.batch_values.batch_value` (an
    `onceflow_batch_value`, which binding gives the batch's value), and must depend on nothing else of the batch:
    binding changes only the rows and the values.
    """

    def __init__(
        self, spark: SparkSession, schema: T.StructType, build: Callable[[DataFrame, BatchValues], DataFrame],
        placeholders: BatchValues,
    ) -> None:
        # Nullable columns: the plan above may not assume a column of a batch never holds NULL.
        placeholder = spark.createDataFrame([], T.StructType([T.StructField(f.name, f.dataType) for f in schema]))
        template = build(placeholder, placeholders)
        self._java = spark._jvm.io.onceflow.PlanTemplate(template._jdf, placeholder._jdf, ",".join(placeholders))

    @staticmethod
    def settings(spark: SparkSession) -> str:
        """A digest of the classic session `spark`'s settings: a template is analysed (and a `LocalProjection`
        optimized) under them, and some expressions read a setting then (`spark.sql.json.enablePartialResults`)."""
        return spark._jvm.io.onceflow.PlanTemplate.settings(spark._jsparkSession)

    def __call__(self, rows: DataFrame, values: BatchValues) -> DataFrame:
        """The plan over the batch's `rows` and its `values`."""
        plain = {name: value if isinstance(value, int) else list(value) for name, value in values.items()}
        return DataFrame(self._java.bind(rows._jdf, json.dumps(plain)), rows.sparkSession)
