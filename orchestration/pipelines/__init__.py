"""The pipelines a code location runs: those of the module `ONCEFLOW_PIPELINES` names (its `PIPELINES` list), or
the built-ins (`events` and the `orders` example).

`load_pipelines` returns them resolved: every runtime knob a declaration left open (batch bounds, watermark band
and idle time, the BigQuery dataset and project) is filled from the settings, so the platform's mechanics only
ever see concrete values. Every error names the pipeline and the field, or the variable.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from typing import Any

from onceflow.jobs.declare.declaration import BigQuerySink, DeclarationError, Pipeline
from onceflow.jobs.declare.durations import render_duration
from onceflow.jobs.declare.sources import FileSource, KafkaSource, PubSubSource
from onceflow.orchestration.pipelines.events import events_pipeline
from onceflow.orchestration.pipelines.orders import orders_pipeline
from onceflow.resources.settings import Settings, SettingsError


def builtin_pipelines(settings: Settings) -> list[Pipeline]:
    return [events_pipeline(settings), orders_pipeline(settings)]


def declared_pipelines(settings: Settings) -> list[Pipeline]:
    """`ONCEFLOW_PIPELINES`'s `PIPELINES`, else the built-ins; not yet resolved."""
    if not settings.pipelines:
        return builtin_pipelines(settings)
    return pipelines_in_module(settings.pipelines, f"ONCEFLOW_PIPELINES={settings.pipelines!r}")


def pipelines_in_module(name: str, named_by: str) -> list[Pipeline]:
    """The `PIPELINES` of the module `name`, not yet resolved; errors start with `named_by`, what named it."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise SettingsError(f"{named_by}: cannot import it ({error})") from None
    pipelines = getattr(module, "PIPELINES", None)
    if not isinstance(pipelines, list | tuple) or not pipelines:
        raise SettingsError(f"{named_by}: the module must define PIPELINES, a non-empty list of Pipeline")
    for index, pipeline in enumerate(pipelines):
        if not isinstance(pipeline, Pipeline):
            raise SettingsError(f"{named_by}: PIPELINES[{index}] is {type(pipeline).__name__}, not a Pipeline")
    return list(pipelines)


def load_pipelines(settings: Settings, pipelines: Sequence[Pipeline] | None = None) -> list[Pipeline]:
    """The code location's pipelines (`pipelines`, else `declared_pipelines`), checked against each other and
    resolved against `settings`."""
    pipelines = list(pipelines) if pipelines is not None else declared_pipelines(settings)
    for index, pipeline in enumerate(pipelines):
        if not isinstance(pipeline, Pipeline):
            raise DeclarationError(f"pipelines[{index}] is {type(pipeline).__name__}, not a Pipeline")
    names = [p.name for p in pipelines]
    assets = [o.asset for p in pipelines for o in p.outputs]
    for name in names:
        if names.count(name) > 1:
            raise DeclarationError(f"pipeline {name!r}: name: two pipelines have this name")
    for pipeline in pipelines:
        for output in pipeline.outputs:
            if assets.count(output.asset) > 1:
                raise DeclarationError(
                    f"pipeline {pipeline.name!r}: output {output.asset!r}: another output has this asset name"
                )
            if output.asset in {f"raw_{n}" for n in names}:
                raise DeclarationError(f"pipeline {pipeline.name!r}: output {output.asset!r}: a raw table's asset name")
    return [resolve(p, settings) for p in pipelines]


def resolve(pipeline: Pipeline, settings: Settings) -> Pipeline:
    """`pipeline` with what it left open filled from `settings`."""
    source = pipeline.source
    if isinstance(source, PubSubSource):
        source = dataclasses.replace(
            source,
            max_messages=source.max_messages or settings.max_messages,
            max_seconds=source.max_seconds or settings.max_seconds,
            max_bytes=source.max_bytes or settings.max_bytes,
            pull_streams=source.pull_streams or settings.pull_streams,
            ack_deadline_s=source.ack_deadline_s or settings.ack_deadline_s,
        )
    elif isinstance(source, FileSource):
        source = dataclasses.replace(source, max_files=source.max_files or settings.max_files)
    elif isinstance(source, KafkaSource):
        source = dataclasses.replace(source, max_records=source.max_records or settings.max_messages)
    outputs = []
    for index, output in enumerate(pipeline.outputs):
        sinks = [_resolve_sink(sink, settings, f"pipeline {pipeline.name!r}: outputs[{index}].sinks[{position}]")
                 for position, sink in enumerate(output.sinks)]
        outputs.append(dataclasses.replace(output, sinks=sinks))
    return dataclasses.replace(
        pipeline,
        source=source,
        outputs=outputs,
        watermark_band=pipeline.watermark_band or render_duration(settings.watermark_band_s),
        watermark_idle=pipeline.watermark_idle or render_duration(settings.watermark_idle_s),
    )


def _resolve_sink(sink: Any, settings: Settings, where: str) -> Any:
    """A `BigQuerySink` with its dataset, project and (under the local deployment) emulator endpoint filled."""
    if not isinstance(sink, BigQuerySink):
        return sink
    sink = dataclasses.replace(
        sink, dataset=sink.dataset or settings.bigquery_dataset, project=sink.project or settings.bigquery_project,
        api_endpoint=sink.api_endpoint or settings.bigquery_emulator_host,
    )
    if sink.dataset is None:
        raise DeclarationError(f"{where}: BigQuerySink(table={sink.table!r}) has no dataset: declare dataset=... "
                               "or set ONCEFLOW_BIGQUERY_DATASET")
    return sink
