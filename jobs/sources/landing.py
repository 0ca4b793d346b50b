"""The landing schema: how every source's batch looks once landed, whatever the source.

`ordinal` is the landing order (the first of two records with one ID wins); `ordinal // STREAM_STRIDE` is the
record's stream within the batch (a file, a Kafka partition's range; 0 for Pub/Sub). `source_position` is the
record's place in its source (the Pub/Sub message id, `<relative path>:<byte offset>` of a file,
`<topic>/<partition>:<offset>` of a Kafka record), `publish_time` the Pub/Sub publish time or Kafka record
timestamp (NULL for files), `attributes` the message attributes or Kafka headers (NULL for files), `data` the
record's bytes. A row whose `data` is NULL stands for records the source lost before they were read (a Kafka range
deleted by retention); it becomes a dead letter. A source may land more columns (its `bookkeeping`).
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

LANDING_SCHEMA = pa.schema(
    [
        ("ordinal", pa.int64()),
        ("source_position", pa.string()),
        ("publish_time", pa.timestamp("ms", tz="UTC")),
        ("attributes", pa.map_(pa.string(), pa.string())),
        ("data", pa.binary()),
    ]
)


STREAM_STRIDE = 1 << 40
"""Ordinals are `stream * STREAM_STRIDE + position in the stream`: for streams under a terabyte (or 2**40 records)."""


class InputGone(RuntimeError):
    """A committed batch's input is no longer in its source as it was landed: deleted by retention, compacted,
    archived, or the log replaced by another (a Kafka topic re-created). Only reconciliation meets it: a batch is
    read before it commits, and its replays are checked against what was planned."""


class BatchOutcome(Protocol):
    """What a source's watermark learns from a committed batch: the newest event time of its valid records, and
    per stream (`ordinal // STREAM_STRIDE`; empty when unknown)."""

    max_event_time_ms: int | None
    stream_max_event_ms: dict[int, int]
