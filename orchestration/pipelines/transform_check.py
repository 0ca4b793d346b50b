"""Checking each output's transform when the code location loads: does it run on the declared schema, and does
it return the declared keys and columns every sink can hold?

The check needs Spark (to analyse the transform on an empty input, no data read), so its verdict is cached
under `<home>/declarations/`, keyed by a fingerprint of the schema, the keys and the transform's code: the code
server pays for it once per change, the run processes that load the same declarations do not. The run itself
checks the real output again, so a stale verdict can never let a wrong result through.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import sys
from collections.abc import Callable

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import (
    WINDOW_BOOKKEEPING,
    BigQuerySink,
    DeclarationError,
    Pipeline,
    WindowedOutput,
)
from onceflow.jobs.declare.kafka_sink import KafkaSink
from onceflow.jobs.declare.postgres_sink import PostgresSink
from onceflow.jobs.declare.record_output import RecordOutput
from onceflow.jobs.declare.sources import IDENTIFIER
from onceflow.jobs.publish.sink_types import bigquery_field, sink_type
from onceflow.jobs.windows.transform import transform_output
from onceflow.resources.object_store import ObjectStore


def fingerprint(pipeline: Pipeline, output: WindowedOutput | RecordOutput) -> str | None:
    """What the verdict depends on; None when the transform has no code object to fingerprint."""
    code = getattr(output.transform, "__code__", None)
    if code is None:
        return None
    identity = json.dumps([pipeline.schema, output.asset, list(getattr(output, "keys", ())), sys.version]).encode()
    return hashlib.sha256(identity + marshal.dumps(code)).hexdigest()


def check_transforms(pipelines: list[Pipeline], spark: Callable[[], SparkSession], cache: ObjectStore) -> None:
    """Raise `DeclarationError` naming the pipeline and output for a transform that does not fit its declaration."""
    for pipeline in pipelines:
        for output in pipeline.outputs:
            if output.transform is None:
                continue
            key = fingerprint(pipeline, output)
            cached = cache.read(f"{key}.json") if key else None
            if cached is not None:
                columns = T.StructType.fromJson(json.loads(cached))
            else:
                try:
                    columns = transform_output(spark(), pipeline, output)
                except Exception as error:  # any failure to analyse is the declaration's, reported as such
                    message = str(error).splitlines()[0] if str(error) else type(error).__name__
                    raise DeclarationError(
                        f"pipeline {pipeline.name!r}: output {output.asset!r}: the transform fails on the declared "
                        f"schema: {message}"
                    ) from error
            if isinstance(output, RecordOutput):
                check_record_columns(pipeline, output, columns)
            else:
                check_transform_output(pipeline, output, columns)
            if key and cached is None:
                cache.write(f"{key}.json", json.dumps(columns.jsonValue()).encode())


def check_transform_output(pipeline: Pipeline, output: WindowedOutput, columns: T.StructType) -> None:
    """Check what `output.transform` returns (its analysed schema) against the declaration."""

    def fail(problem: str) -> None:
        raise DeclarationError(f"pipeline {pipeline.name!r}: output {output.asset!r}: {problem}")

    names = [f.name for f in columns]
    for key in output.keys:
        if key not in names:
            fail(f"key {key!r} is not a column of the transform's output ({', '.join(names) or 'none'})")
    for name in names:
        if name in WINDOW_BOOKKEEPING:
            fail(f"the transform outputs {name!r}, a column onceflow adds itself")
        if not IDENTIFIER.match(name):
            fail(f"output column {name!r}: name it with letters, digits and '_' (use .alias)")
    if output.sinks:
        to_bigquery = any(isinstance(sink, BigQuerySink) for sink in output.sinks)
        for f in columns:
            try:
                kind = sink_type(f.dataType)
                if to_bigquery:
                    bigquery_field(f.name, kind)
            except ValueError as error:
                fail(f"output column {f.name!r}: {error}")


def check_record_columns(pipeline: Pipeline, output: RecordOutput, columns: T.StructType) -> None:
    """Check what a record output's transform returns against its sinks: column names they can hold, and the
    columns their keys name."""

    def fail(problem: str) -> None:
        raise DeclarationError(f"pipeline {pipeline.name!r}: output {output.asset!r}: {problem}")

    names = [f.name for f in columns]
    for name in names:
        if not IDENTIFIER.match(name):
            fail(f"output column {name!r}: name it with letters, digits and '_' (use .alias)")
    for index, sink in enumerate(output.sinks):
        keys = sink.key if isinstance(sink, PostgresSink) else (sink.key,) if isinstance(sink, KafkaSink) else ()
        for key in keys:
            if key is not None and key not in names:
                fail(f"sinks[{index}] ({sink.name}): key {key!r} is not a column of the transform's output "
                     f"({', '.join(names) or 'none'})")
        if isinstance(sink, BigQuerySink):
            for f in columns:
                if (problem := _bigquery_problem(f.dataType)) is not None:
                    fail(f"sinks[{index}] ({sink.name}): output column {f.name!r}: {problem} (convert it in the "
                         "transform, a map with to_json)")


def _bigquery_problem(data_type: T.DataType, in_array: bool = False) -> str | None:
    """Why BigQuery cannot hold a record output's column of this type as it is, or None."""
    if isinstance(data_type, T.MapType):
        return "BigQuery has no MAP type"
    if isinstance(data_type, T.ArrayType):
        return "BigQuery arrays cannot hold arrays" if in_array else _bigquery_problem(data_type.elementType, True)
    if isinstance(data_type, T.StructType):
        return next((p for f in data_type if (p := _bigquery_problem(f.dataType)) is not None), None)
    return None
