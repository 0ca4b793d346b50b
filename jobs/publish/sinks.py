"""Where an output's final panes go, and publishing every window a materialization closed.

An output's sinks (its declaration's `FileSink` and `BigQuerySink`) resolve to a files root and a BigQuery
target. A BigQuery-only output still stages its pane files (under `<home>/staging`): the load reads them, by
checksum, from there. Publishing is `onceflow.jobs.publish.pane_sequence.publish_pane` (the commit sequence, written ahead) then
`run_sequence` once; whatever that attempt leaves unfinished, the commit sensor finishes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import BigQuerySink, FileSink, WindowedOutput
from onceflow.jobs.declare.schema import has_variant
from onceflow.jobs.publish.pane_sequence import BigQueryTarget, publish_pane
from onceflow.jobs.publish.sequence import CommitResult, run_sequence
from onceflow.jobs.publish.sink_types import sink_type
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.windows.panes import Window
from onceflow.jobs.windows.transform import WindowResult


@dataclass(frozen=True)
class OutputSinks:
    """An output's resolved sinks: `files_root` None means no files (and then no BigQuery either)."""

    files_root: str | None
    bigquery: BigQueryTarget | None


def files_root(output: WindowedOutput, published_root: str, staging_root: str) -> str | None:
    """Where an output's pane files go: its FileSink's path (default `published_root`); the staging root for a
    BigQuery-only output (its loads read them); None with no sink at all."""
    file_sink = next((s for s in output.sinks if isinstance(s, FileSink)), None)
    if file_sink is not None:
        return file_sink.path or published_root
    return staging_root if any(isinstance(s, BigQuerySink) for s in output.sinks) else None


def output_sinks(
    output: WindowedOutput, published_root: str, staging_root: str, bigquery_project: str | None
) -> OutputSinks:
    """Resolve an output's declared sinks; `bigquery_project` is the project of a BigQuerySink without one."""
    bq_sink = next((s for s in output.sinks if isinstance(s, BigQuerySink)), None)
    target = None
    if bq_sink is not None:
        project = bq_sink.project or bigquery_project
        if project is None or bq_sink.dataset is None:
            raise ValueError(f"{output.asset}: BigQuerySink(table={bq_sink.table!r}) needs a project and a dataset")
        target = BigQueryTarget(project, bq_sink.dataset, bq_sink.table, ("window_start", *output.keys))
    return OutputSinks(files_root(output, published_root, staging_root), target)


def window_table_schema(spark: SparkSession, windows_path: str) -> list[tuple[str, str]]:
    """The window table's columns as (name, sink type): what a published pane's rows hold."""
    schema = spark.read.format("delta").load(windows_path).schema
    return [(f.name, str(sink_type(f.dataType))) for f in schema]


def publish_closed(
    spark: SparkSession,
    ctx: CommitContext,
    output: WindowedOutput,
    sinks: OutputSinks,
    windows_path: str,
    results: list[WindowResult],
    run_id: str,
    root_run_id: str,
) -> dict[str, CommitResult]:
    """Publish the final pane of every closed window in `results`; the outcome per window key.

    A failed publication does not fail the materialization (the window table is committed): the sequence stays
    pending and the commit sensor launches the next attempt.
    """
    closed = [r for r in results if r.closed]
    if not closed:
        return {}
    schema = window_table_schema(spark, windows_path)
    outcomes = {}
    for result in closed:
        published = publish_pane(
            ctx.store,
            asset=output.asset,
            window=result.window,
            pane=result.pane,
            rows=pane_rows(spark, windows_path, result.window, result.pane),
            schema=schema,
            sink_root=sinks.files_root,
            bigquery=sinks.bigquery,
        )
        outcomes[result.window.key] = run_sequence(ctx, published.sequence.id, run_id, root_run_id)
    return outcomes


def pane_rows(spark: SparkSession, windows_path: str, window: Window, pane: int) -> pa.Table:
    """The rows of `window` in the window table, which must hold pane `pane` (or nothing: an empty pane).

    Raises `RuntimeError` if the table holds another pane of the window, e.g. a newer one merged by a concurrent
    run: publishing reads exactly the pane it was asked to publish.
    """
    rows = spark.sql(f"SELECT * FROM delta.`{windows_path}` WHERE window_start = timestamp_millis({window.start_ms})")
    table = rows.select(*(_variants_as_json(F.col(f"`{f.name}`"), f.dataType).alias(f.name) for f in rows.schema)).toArrow()
    found = set(table.column("pane").to_pylist())
    if found - {pane}:
        raise RuntimeError(f"window {window.key} holds panes {sorted(found)} in {windows_path}, not pane {pane}")
    return table


def _variants_as_json(column: Column, data_type: T.DataType) -> Column:
    """`column` with every VARIANT in it (at any depth) as its JSON text, the form the sinks take it in: the
    variant's own Arrow form does not survive a NULL variant on Spark Connect, and its JSON text is exact."""
    if isinstance(data_type, T.VariantType):
        return F.to_json(column)
    if not has_variant(data_type):
        return column
    if isinstance(data_type, T.ArrayType):
        return F.transform(column, lambda element: _variants_as_json(element, data_type.elementType))
    if isinstance(data_type, T.MapType):
        return F.transform_values(column, lambda _, value: _variants_as_json(value, data_type.valueType))
    assert isinstance(data_type, T.StructType)
    fields = [_variants_as_json(column[f.name], f.dataType).alias(f.name) for f in data_type.fields]
    return F.when(column.isNotNull(), F.struct(*fields))
