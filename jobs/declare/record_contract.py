"""A pipeline's record contract: where a record's ID and event time come from, its schema and its limits.

A batch is classified under the contract of the declaration that planned it, carried in its plan
(`to_dict`), on every attempt: a deploy between two attempts of a batch (a nullable field added, a limit raised)
changes the batches planned after it, never one half committed. Only the delivery mode cannot be carried: a batch
planned under one mode and replayed under another is refused (`ContractChanged`), naming the way out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.sources import FileSource, KafkaSource


class ContractChanged(RuntimeError):
    """A batch planned under a declaration that the current one cannot replay as it was planned."""


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
        common: dict[str, Any] = {
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

    def to_dict(self, delivery: str) -> dict[str, Any]:
        """The contract as a plan carries it (JSON values), with the pipeline's `delivery` mode."""
        return {**asdict(self), "schema": json.loads(self.schema.json()), "delivery": delivery}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecordContract:
        fields = {k: v for k, v in data.items() if k != "delivery"}
        return cls(**{**fields, "schema": T.StructType.fromJson(data["schema"])})

    @classmethod
    def planned(cls, pipeline: Pipeline, contract: dict[str, Any] | None, batch: str) -> RecordContract:
        """The contract batch `batch` (its name, for errors) is classified under: the one its plan carries
        (`contract`), else (a plan made before plans carried one) the declaration's."""
        if contract is None:
            return cls.of(pipeline)
        if contract.get("delivery") != pipeline.delivery:
            raise ContractChanged(
                f"{batch} was planned under delivery={contract.get('delivery')!r} and the pipeline now declares "
                f"delivery={pipeline.delivery!r}: a batch is committed under one mode. Deploy the old mode until it "
                f"commits, or drop it with `onceflow reset {pipeline.name} --drop-uncommitted` (its records are "
                "planned again under the new mode where the source still holds them)"
            )
        return cls.from_dict(contract)
