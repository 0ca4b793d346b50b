"""The landing schema: how every source's batch looks once landed, whatever the source.

`ordinal` is the landing order (the first of two records with one ID wins), `source_position` the record's place
in its source (the Pub/Sub message id, or `<relative path>:<byte offset>` of a file), `publish_time` the Pub/Sub
publish time (NULL for files), `attributes` the message attributes (NULL for files), `data` the record's bytes.
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


class BatchOutcome(Protocol):
    """What a source's watermark learns from a committed batch."""

    max_event_time_ms: int | None
