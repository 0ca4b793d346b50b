"""A batch's plan analysed once per pipeline and bound to each batch's landed rows (classic sessions).

Spark analyses a DataFrame as it is built: every projection's expressions are resolved, type-checked and coerced.
A realistic pipeline's validation is large, and analysing it again for each batch cost a tenth of a second of a
one-second batch, on the driver, while the executors waited. Structured Streaming analyses its query once and
replaces its sources' leaves each micro-batch; `PlanTemplate` (Java, beside this file) does the same for a batch's
plan. Over Spark Connect the plan is analysed by the server, and is built per batch as it always was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T


class PlanTemplate:
    """The DataFrame `build(landed, numbers)` makes of a batch's landed rows (of `schema`) and its `numbers` (BIGINT
    values by name, in `names` order), analysed once in the classic session `spark`.

    `build` must make the numbers columns through `onceflow.jobs.ingest.batch_values.with_batch_values` (a one-row
    table joined to the batch, which binding replaces), and must depend on nothing else of the batch: binding
    changes only the landed rows and the numbers.
    """

    def __init__(
        self, spark: SparkSession, schema: T.StructType, build: Callable[[DataFrame, dict[str, int]], DataFrame],
        names: Sequence[str],
    ) -> None:
        # Nullable columns: the plan above may not assume a column of a batch never holds NULL.
        placeholder = spark.createDataFrame([], T.StructType([T.StructField(f.name, f.dataType) for f in schema]))
        self._names = tuple(names)
        template = build(placeholder, dict.fromkeys(self._names, 0))
        self._java = spark._jvm.io.onceflow.PlanTemplate(template._jdf, placeholder._jdf, ",".join(self._names))

    def __call__(self, landed: DataFrame, numbers: Mapping[str, int]) -> DataFrame:
        """The plan over the batch's `landed` rows and its `numbers`."""
        jdf = self._java.bind(landed._jdf, ",".join(str(int(numbers[name])) for name in self._names))
        return DataFrame(jdf, landed.sparkSession)
