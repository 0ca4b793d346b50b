"""The identity of every landed record, read in plain Python: a second reading of the landing, independent of the
Spark validation it is used to check.

For each record of a committed batch: its record ID (the declared attribute or JSON field, else its position) and
its event time (the declared attribute or field, epoch milliseconds or RFC 3339, else the publish time for
Pub/Sub), exactly as DESIGN section 4 defines them — but computed here from the landed bytes with `json` and
`datetime`, not with the Spark expressions of `onceflow.jobs.ingest.validation`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from onceflow.jobs.declare.record_contract import RecordContract

_EPOCH_MS = re.compile(r"^-?[0-9]{1,15}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class LandedRow:
    """One landed record as its bytes and message metadata."""

    position: str
    attributes: dict[str, str | None] | None
    data: bytes
    publish_time_ms: int | None


@dataclass(frozen=True)
class LandedRecord:
    batch_id: int
    record_id: str
    event_time_ms: int | None


def identify(batch_id: int, row: LandedRow, contract: RecordContract) -> LandedRecord:
    """The record's ID and event time (None when it has none usable)."""
    # An oversized record is not parsed (as validation does not): its ID falls back to its position.
    body = _object(row.data) if len(row.data) <= contract.max_record_bytes else None
    record_id = _located(row, body, contract.id_attribute, contract.id_field) or row.position  # empty: none
    raw_time = _located(row, body, contract.time_attribute, contract.time_field)
    if raw_time is None:
        event_ms = row.publish_time_ms if contract.time_from_publish else None
    else:
        event_ms = parse_time_ms(raw_time)
    return LandedRecord(batch_id, record_id, event_ms)


LANDED = pa.schema([("batch_id", pa.int64()), ("record_id", pa.large_string()), ("event_time_ms", pa.int64())])
"""The landed records as columns, in landing order (`identify_all`)."""


def identify_all(batches: Iterator[tuple[int, list[LandedRow], RecordContract]]) -> pa.Table:
    """Every landed record of `batches` (each with the contract it was classified under) (`LANDED`). A batch's rows
    and Python objects live only while it is identified: what is kept is its columns."""
    parts = []
    for batch_id, rows, contract in batches:
        records = [identify(batch_id, row, contract) for row in rows]
        parts.append(pa.record_batch([
            pa.array([batch_id] * len(records), pa.int64()),
            pa.array([r.record_id for r in records], pa.large_string()),
            pa.array([r.event_time_ms for r in records], pa.int64()),
        ], schema=LANDED))
    return pa.Table.from_batches(parts, schema=LANDED)


def parse_time_ms(text: str) -> int | None:
    """Up to 15 digits are epoch milliseconds; anything else must be RFC 3339 (a missing offset is UTC)."""
    text = text.strip()
    if _EPOCH_MS.match(text):
        return int(text)
    try:
        parsed = datetime.fromisoformat(text.upper().replace(" ", "T"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - _EPOCH) // timedelta(milliseconds=1)


def _object(data: bytes) -> dict | None:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _located(row: LandedRow, body: dict | None, attribute: str | None, field: str | None) -> str | None:
    if attribute is not None:
        return (row.attributes or {}).get(attribute)
    if field is not None and body is not None:
        value = body.get(field)
        if value is None or isinstance(value, dict | list):
            return None
        return json.dumps(value) if isinstance(value, bool) else str(value)
    return None
