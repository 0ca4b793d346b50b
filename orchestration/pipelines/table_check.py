"""Checking each pipeline's raw table against its declared schema when the code location loads.

A table made for an earlier declaration gains the declaration's new nullable fields here; any other change fails
the load with a `DeclarationError` (`onceflow.jobs.delta.schema_evolution`). Only the Delta log is read (delta-rs, no Spark). A
lake that cannot be read now is checked again before the run's first batch (`onceflow.jobs.ingest.batch_ingest.ensure_raw_table`), so
an unreachable lake does not keep every pipeline of the code location from loading.
"""

from __future__ import annotations

import logging

from onceflow.jobs.declare.declaration import DeclarationError, Pipeline
from onceflow.jobs.delta.raw_table import raw_schema
from onceflow.jobs.delta.schema_evolution import evolve_raw_table
from onceflow.resources.lake import LakeResource

log = logging.getLogger("onceflow")


def check_raw_tables(pipelines: list[Pipeline], lake: LakeResource) -> None:
    for pipeline in pipelines:
        path = lake.table_path(pipeline.raw_table)
        try:
            evolve_raw_table(pipeline, path, raw_schema(pipeline))
        except DeclarationError:
            raise
        except Exception as error:  # the lake, not the declaration: the run checks again before its first batch
            log.warning(f"pipeline {pipeline.name!r}: could not check {path} against the declared schema now "
                        f"({error}); it is checked before the first batch")
