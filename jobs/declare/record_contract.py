"""A pipeline's record contract: where a record's ID and event time come from, its schema and its limits."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.sources import FileSource, KafkaSource


@dataclass(frozen=True)
class RecordContract:
    """Where a record's ID and event time come from, the payload schema, and the limits a record must keep.

    IDs and times come from a message attribute (a Kafka header) or a payload field; without one (or on a record
    that lacks it) the ID is the record's source position and the time is the publish time (when
    `time_from_publish`; a Kafka record's timestamp).
    """

    schema: T.StructType
    max_record_bytes: int
    max_clock_skew_ms: int
    id_attribute: str | None = None
    id_field: str | None = None
    time_attribute: str | None = None
    time_field: str | None = None
    time_from_publish: bool = False

    @classmethod
    def of(cls, pipeline: Pipeline) -> RecordContract:
        source = pipeline.source
        common = {
            "schema": pipeline.record_schema,
            "max_record_bytes": pipeline.max_record_bytes,
            "max_clock_skew_ms": pipeline.max_clock_skew_s * 1000,
        }
        if isinstance(source, FileSource):
            return cls(**common, id_field=source.id_field, time_field=source.timestamp_field)
        if isinstance(source, KafkaSource):
            # A declared time field is the only clock: a record without it is dead-lettered, as for files.
            return cls(**common, id_attribute=source.id_header, id_field=source.id_field,
                       time_field=source.timestamp_field, time_from_publish=source.timestamp_field is None)
        return cls(
            **common, id_attribute=source.id_attribute, time_attribute=source.timestamp_attribute,
            time_from_publish=True,
        )
