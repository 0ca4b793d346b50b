"""The sources a pipeline declares (`FileSource`, `PubSubSource`), and their checks, made when a `Pipeline` is
constructed. `IDENTIFIER` and `checked_duration` are shared with the rest of the declaration."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from onceflow.jobs.declare.durations import parse_duration

COMPRESSED = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst", ".zstd", ".xz", ".br", ".zip")
"""File suffixes Spark would decompress; a `FileSource` reads its files' bytes as they are."""


IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_PUBSUB_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9._~%+-]{2,254}$")


@dataclass(frozen=True, kw_only=True)
class PubSubSource:
    """A Pub/Sub subscription, plus a metadata-only tracking subscription for the watermark.

    `id_attribute` carries the record ID (it survives publisher retries; without it, or on a message that lacks
    it, the message id is used). `timestamp_attribute` carries the event time (RFC 3339 or epoch milliseconds;
    without it the publish time is used). The tracking subscription defaults to `<subscription>-tracking`.
    A batch holds at most `max_messages` messages and `max_bytes` bytes of data and attributes, pulled for at
    most `max_seconds` with `pull_streams` pull requests in flight.
    """

    kind: ClassVar[str] = "pubsub"
    topic: str
    subscription: str
    id_attribute: str | None = None
    timestamp_attribute: str | None = None
    tracking_subscription: str | None = None
    max_messages: int | None = None
    max_seconds: float | None = None
    max_bytes: int | None = None
    pull_streams: int | None = None
    ack_deadline_s: int | None = None

    @property
    def tracking(self) -> str:
        return self.tracking_subscription or f"{self.subscription}-tracking"


@dataclass(frozen=True, kw_only=True)
class FileSource:
    """A directory of JSON-lines files (one object per line), taken in sorted order; files must not change.

    `id_field` names the record ID field (without it, or on a line that lacks it, the ID is
    `<relative path>:<byte offset>`); `timestamp_field` the event time (RFC 3339 or epoch milliseconds).
    The watermark is the newest event time seen minus `out_of_orderness`.
    """

    kind: ClassVar[str] = "files"
    directory: str
    timestamp_field: str
    pattern: str = "*.jsonl"
    id_field: str | None = None
    out_of_orderness: str = "30s"
    max_files: int | None = None
    max_bytes: int = 256 * 1024 * 1024


Source = PubSubSource | FileSource


def checked_duration(value: object, where: str, fail: Callable[[str, str], None]) -> int:
    try:
        return parse_duration(value)  # type: ignore[arg-type]
    except ValueError as error:
        fail(where, str(error))
    return 0


def check_source(source: Source, fail: Callable[[str, str], None]) -> None:
    if isinstance(source, PubSubSource):
        for name in ("topic", "subscription"):
            if not isinstance(getattr(source, name), str) or not _PUBSUB_NAME.match(getattr(source, name)):
                fail(f"source.{name}", f"{getattr(source, name)!r} is not a Pub/Sub name (3-255 characters, "
                     "starting with a letter)")
        if not _PUBSUB_NAME.match(source.tracking):
            fail("source.tracking_subscription", f"{source.tracking!r} is not a Pub/Sub name")
        # Pub/Sub takes 10..600 s; its emulator 1..600, which tests use for quick redelivery.
        if source.ack_deadline_s is not None and not 1 <= source.ack_deadline_s <= 600:
            fail("source.ack_deadline_s", f"{source.ack_deadline_s} is outside 1..600 seconds")
        if source.pull_streams is not None and not 1 <= source.pull_streams <= 64:
            fail("source.pull_streams", f"{source.pull_streams} is outside 1..64")
    else:
        for name in ("timestamp_field", "id_field"):
            value = getattr(source, name)
            if value is not None and (not isinstance(value, str) or not IDENTIFIER.match(value)):
                fail(f"source.{name}", f"{value!r}: use letters, digits and '_'")
        if isinstance(source.pattern, str) and source.pattern.lower().endswith(COMPRESSED):
            fail("source.pattern", f"{source.pattern!r}: compressed files are not read (a record's position is its "
                 "byte offset in the file, and files are counted by their lines): decompress them into the directory")
        checked_duration(source.out_of_orderness, "source.out_of_orderness", fail)
    for name in ("max_messages", "max_files", "max_seconds", "max_bytes"):
        value = getattr(source, name, None)
        if value is not None and not value > 0:
            fail(f"source.{name}", f"{value!r} must be positive")
