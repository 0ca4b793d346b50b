"""The public API for declaring pipelines (DESIGN section 6a): what a data engineer imports.

    from orchestration.api import BigQuerySink, FileSink, FileSource, Pipeline, PubSubSource, WindowedOutput

A module whose `PIPELINES` list holds `Pipeline`s, named by `ONCEFLOW_PIPELINES=package.module`, replaces the
built-in pipelines of the code location. See the README, "Add your own pipeline".
"""

from jobs.declaration import (
    BigQuerySink,
    DeclarationError,
    FileSink,
    FileSource,
    Pipeline,
    PubSubSource,
    WindowedOutput,
)

__all__ = [
    "BigQuerySink",
    "DeclarationError",
    "FileSink",
    "FileSource",
    "Pipeline",
    "PubSubSource",
    "WindowedOutput",
]
