"""The sources a pipeline declares (`FileSource`, `PubSubSource`, `KafkaSource`), and their checks, made when a
`Pipeline` is constructed. `IDENTIFIER` and `checked_duration` are shared with the rest of the declaration."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from pyspark.sql import types as T

from onceflow.jobs.declare.durations import Duration, normal_duration, parse_duration

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
    bookkeeping: ClassVar[T.StructType] = T.StructType()
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
    bookkeeping: ClassVar[T.StructType] = T.StructType()
    directory: str
    timestamp_field: str
    pattern: str = "*.jsonl"
    id_field: str | None = None
    out_of_orderness: Duration = "30s"
    max_files: int | None = None
    max_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_of_orderness", normal_duration(self.out_of_orderness))


_KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
LostRecords = Literal["fail", "dead_letter"]
LOST_RECORDS: tuple[str, ...] = get_args(LostRecords)
KAFKA_OWNED_OPTIONS = frozenset({
    "bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset", "key.deserializer",
    "value.deserializer", "enable.partition.eof",
})
"""Consumer settings onceflow sets itself: a batch's offsets come from its plan, never from the consumer."""


@dataclass(frozen=True, kw_only=True)
class KafkaSource:
    """A Kafka topic; every record sits at a fixed `(topic, partition, offset)`, so no landing copy is needed.

    A batch is, per partition, an offset range `[from, until)` fixed before it is read, ending at most at the
    partition's last stable offset, and read with `read_committed` isolation: records of aborted transactions
    never enter raw and an open transaction never changes what a batch holds. The ID is the record header
    `id_header` (UTF-8) or the JSON field `id_field`, else the position `<topic>/<partition>:<offset>`; the event
    time the field `timestamp_field`, else the Kafka record timestamp. A new pipeline (or a new epoch after a
    reset) starts at `starting_offsets`; a partition added later is read from its first offset. A batch holds at
    most `max_records` records over all partitions. Records the topic's retention deleted before they were read
    stop the source with an error (`on_lost_records="fail"`), or become one dead-letter row per lost range
    (`"dead_letter"`, reason `lost_in_source`). `options` are Kafka consumer settings (`security.protocol`, ...);
    a secret is given as `dg.EnvVar("NAME")` and read from the environment when a client is made.
    """

    kind: ClassVar[str] = "kafka"
    # Kept in raw beside the common columns, exactly as Kafka has them (a header may repeat; values are bytes).
    bookkeeping: ClassVar[T.StructType] = T.StructType([
        T.StructField("kafka_key", T.BinaryType()),
        T.StructField("kafka_headers", T.ArrayType(T.StructType([
            T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))),
    ])
    bootstrap_servers: str | Sequence[str]
    topic: str
    id_header: str | None = None
    id_field: str | None = None
    timestamp_field: str | None = None
    out_of_orderness: Duration = "30s"
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    max_records: int | None = None
    on_lost_records: LostRecords = "fail"
    options: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_of_orderness", normal_duration(self.out_of_orderness))

    @property
    def servers(self) -> str:
        """`bootstrap_servers` as Kafka's comma-separated setting."""
        servers = self.bootstrap_servers
        return servers if isinstance(servers, str) else ",".join(servers)

    def consumer_options(self) -> dict[str, str]:
        """`options` with every `dg.EnvVar` (anything with `get_value`) read from the environment now."""
        return {key: str(value.get_value() if hasattr(value, "get_value") else value)
                for key, value in self.options.items()}


Source = PubSubSource | FileSource | KafkaSource


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
    elif isinstance(source, KafkaSource):
        _check_kafka(source, fail)
    else:
        for name in ("timestamp_field", "id_field"):
            value = getattr(source, name)
            if value is not None and (not isinstance(value, str) or not IDENTIFIER.match(value)):
                fail(f"source.{name}", f"{value!r}: use letters, digits and '_'")
        if isinstance(source.pattern, str) and {"", ".", "..", "**"} & set(source.pattern.split("/")):
            fail("source.pattern", f"{source.pattern!r}: a pattern matches a file's name, or its name and the "
                 "directories right above it (`sub/*.jsonl`), at any depth: no '**', '.', '..' or empty part")
        if isinstance(source.pattern, str) and source.pattern.lower().endswith(COMPRESSED):
            fail("source.pattern", f"{source.pattern!r}: compressed files are not read (a record's position is its "
                 "byte offset in the file, and files are counted by their lines): decompress them into the directory")
        checked_duration(source.out_of_orderness, "source.out_of_orderness", fail)
    for name in ("max_messages", "max_files", "max_seconds", "max_bytes", "max_records"):
        value = getattr(source, name, None)
        if value is not None and not value > 0:
            fail(f"source.{name}", f"{value!r} must be positive")


def _check_kafka(source: KafkaSource, fail: Callable[[str, str], None]) -> None:
    servers = [source.bootstrap_servers] if isinstance(source.bootstrap_servers, str) else source.bootstrap_servers
    if not servers or not all(isinstance(s, str) and re.match(r"^[^\s,]+:[0-9]{1,5}$", s.strip()) for s in
                              ",".join(servers).split(",")):
        fail("source.bootstrap_servers", f"{source.bootstrap_servers!r}: give host:port, or a list of them")
    if not isinstance(source.topic, str) or not _KAFKA_TOPIC.match(source.topic):
        fail("source.topic", f"{source.topic!r} is not a Kafka topic name (1-249 of letters, digits, '.', '_', '-')")
    if source.id_header is not None and source.id_field is not None:
        fail("source.id_header", "declare id_header or id_field, not both")
    if source.id_header is not None and (not isinstance(source.id_header, str) or not source.id_header):
        fail("source.id_header", f"{source.id_header!r} is not a header name")
    for name in ("timestamp_field", "id_field"):
        value = getattr(source, name)
        if value is not None and (not isinstance(value, str) or not IDENTIFIER.match(value)):
            fail(f"source.{name}", f"{value!r}: use letters, digits and '_'")
    if source.starting_offsets not in ("earliest", "latest"):
        fail("source.starting_offsets", f"{source.starting_offsets!r}: use 'earliest' or 'latest'")
    if source.on_lost_records not in LOST_RECORDS:
        fail("source.on_lost_records", f"{source.on_lost_records!r}: use 'fail' or 'dead_letter'")
    if not isinstance(source.options, Mapping):
        fail("source.options", "a mapping of Kafka consumer settings to values")
    for key in source.options:
        if not isinstance(key, str) or key in KAFKA_OWNED_OPTIONS:
            fail(f"source.options[{key!r}]", f"onceflow sets {key!r} itself (a batch's offsets come from its plan)"
                 if key in KAFKA_OWNED_OPTIONS else "setting names are strings")
    checked_duration(source.out_of_orderness, "source.out_of_orderness", fail)
