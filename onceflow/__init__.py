"""onceflow: exactly-once pipelines on Spark and Delta Lake, orchestrated by Dagster.

What a data engineer imports (DESIGN section 6a):

    import onceflow
    from onceflow import BigQuerySink, FileSink, FileSource, KafkaSource, Pipeline, PubSubSource, WindowedOutput
    from onceflow import KafkaSink, PostgresSink, RecordOutput, Sink   # record outputs (section 6b)

    defs = onceflow.definitions([my_pipeline])   # a Dagster `Definitions` for a project's code location

or, in a `dg` project, a component in `defs/` YAML: `type: onceflow.OnceflowPipelines`
(`onceflow.orchestration.component`).

The installed distribution's only import name is `onceflow`; the repository's folders are its subpackages
(`onceflow.orchestration`, `onceflow.assets`, `onceflow.jobs`, `onceflow.resources`). Names resolve on first use,
so importing one stage does not load Dagster's whole code location.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onceflow.jobs.declare.bigquery_sink import BigQuerySink
    from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
    from onceflow.jobs.declare.errors import DeclarationError
    from onceflow.jobs.declare.file_sink import FileSink
    from onceflow.jobs.declare.kafka_sink import KafkaSink
    from onceflow.jobs.declare.postgres_sink import PostgresSink
    from onceflow.jobs.declare.record_output import RecordOutput
    from onceflow.jobs.declare.sink import Commit, Sink, SinkUnavailable
    from onceflow.jobs.declare.sources import FileSource, KafkaSource, PubSubSource
    from onceflow.orchestration.component import OnceflowPipelines
    from onceflow.orchestration.definitions import definitions

__version__ = "0.2.0"

_PUBLIC = {
    "BigQuerySink": "onceflow.jobs.declare.bigquery_sink",
    "Commit": "onceflow.jobs.declare.sink",
    "DeclarationError": "onceflow.jobs.declare.errors",
    "FileSink": "onceflow.jobs.declare.file_sink",
    "KafkaSink": "onceflow.jobs.declare.kafka_sink",
    "PostgresSink": "onceflow.jobs.declare.postgres_sink",
    "RecordOutput": "onceflow.jobs.declare.record_output",
    "Sink": "onceflow.jobs.declare.sink",
    "SinkUnavailable": "onceflow.jobs.declare.sink",
    "FileSource": "onceflow.jobs.declare.sources",
    "KafkaSource": "onceflow.jobs.declare.sources",
    "Pipeline": "onceflow.jobs.declare.declaration",
    "PubSubSource": "onceflow.jobs.declare.sources",
    "WindowedOutput": "onceflow.jobs.declare.declaration",
    "definitions": "onceflow.orchestration.definitions",
    "OnceflowPipelines": "onceflow.orchestration.component",
}
__all__ = [
    "BigQuerySink",
    "Commit",
    "DeclarationError",
    "FileSink",
    "FileSource",
    "KafkaSink",
    "KafkaSource",
    "OnceflowPipelines",
    "Pipeline",
    "PostgresSink",
    "PubSubSource",
    "RecordOutput",
    "Sink",
    "SinkUnavailable",
    "WindowedOutput",
    "__version__",
    "definitions",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'onceflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # `dg` finds components by listing the registered module (the `dagster_dg_cli.registry_modules` entry point).
    return sorted(set(globals()) | set(__all__))
