"""The sink contract (`onceflow.Sink`): where a record output's publications go, each exactly once by its `Commit`.

A publication is the records one raw batch inserted, as the output gives them (its transform applied), in a
pyarrow table. onceflow stages it (a file whose checksum the commit sequence records) before any sink sees it, then
for each sink runs the commit step `verify` = `committed(commit)`, else `write(rows, commit)` then `committed`
again, any number of times, from the ingest run or from the commit sensor's finalize run, possibly two at once:

- `write(rows, commit)` must be idempotent for one commit: writing a commit the sink holds already changes
  nothing, and two writers of one commit at the same time leave it written once (a transaction that checks the
  commit's marker under a lock, a deterministic object name, an idempotency key).
- `committed(commit)` is read-only and True exactly when the sink holds the commit's rows whole.

Built-in sinks: `FileSink`, `PostgresSink`, `KafkaSink`. A sink of a user's own subclasses `Sink` (as a frozen
dataclass, like those) and gets the same write-ahead log, attempts, quarantine, asset checks and `verify`.
"""

from __future__ import annotations

import base64
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Commit:
    """The identity of one publication: the records batch `batch` (of the source's epoch `epoch`) of pipeline
    `pipeline` inserted into its raw table, as record output `output` gives them. `id` is its one-string form."""

    pipeline: str
    output: str
    epoch: int
    batch: int

    @property
    def id(self) -> str:
        return f"{self.pipeline}/{self.output}/{self.epoch}/{self.batch}"


class SinkUnavailable(ConnectionError):
    """Raised by a sink that cannot be reached now (connection refused, broker down): the attempt fails without
    using the sequence's budget, and the next one waits longer (up to a few minutes), however long the outage.
    Any `ConnectionError` counts as this (the built-in sinks' clients raise those)."""


class Sink(ABC):
    """A system a record output publishes to, exactly once per `Commit` (see the module docstring).

    `name` identifies the sink among its output's sinks, and in commit sequences written before a change of the
    declaration: a sequence whose sink is no longer declared fails with that name rather than writing elsewhere.
    """

    @property
    def name(self) -> str:
        return type(self).__name__

    @abstractmethod
    def write(self, rows: pa.Table, commit: Commit) -> None:
        """Publish `rows` as `commit`; idempotent for one commit. `SinkUnavailable` when the system cannot be
        reached (any other error uses one of the sequence's attempts)."""

    @abstractmethod
    def committed(self, commit: Commit) -> bool:
        """Whether the sink holds `commit` whole; changes nothing. `SinkUnavailable` as for `write`."""

    def rows(self, commit: Commit) -> int | None:
        """How many rows the sink holds for `commit`, when it can tell (for `onceflow verify`); None when not."""
        return None

    def problems(self) -> list[str]:
        """What is wrong with the sink's declaration, found without connecting to anything (checked at load)."""
        return []

    def close(self) -> None:  # noqa: B027 - a sink holding no connection has nothing to let go
        """Let go of connections the sink holds (it may be used again after)."""


def record_json(row: dict[str, Any]) -> str:
    """A record (a row of `pyarrow.Table.to_pylist`) as one JSON object: timestamps in RFC 3339 UTC with
    microseconds, decimals as strings of their exact digits (JSON numbers are read as binary floats), bytes in
    base64."""
    return json.dumps(row, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.strftime("%Y-%m-%dT%H:%M:%S.%f")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} value {value!r} has no JSON form")
