"""The public pipeline declaration: what a data engineer writes (re-exported as `from onceflow import …`).

A `Pipeline` names a source, the schema of its records, how duplicates are handled, and its windowed outputs.
Every check that needs no data runs when the declaration is constructed, and a mistake raises `DeclarationError`
naming the pipeline and the field (`pipeline 'orders': outputs[0].window: ...`). The transform's output is
checked against `keys` when the code location loads (`check_transform_output`), since that needs Spark.

Semantics are fixed by the declaration; runtime knobs a declaration leaves as None (batch bounds, watermark band
and idle time, the BigQuery dataset) come from `ONCEFLOW_*` settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, Literal, get_args

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from onceflow.jobs.declare.bigquery_sink import BigQuerySink
from onceflow.jobs.declare.durations import Duration, check_window_size, normal_duration, parse_duration
from onceflow.jobs.declare.errors import DeclarationError
from onceflow.jobs.declare.file_sink import FileSink
from onceflow.jobs.declare.record_output import RecordOutput, check_record_output
from onceflow.jobs.declare.schema import SchemaError, parse_schema, schema_ddl
from onceflow.jobs.declare.sources import (
    IDENTIFIER,
    FileSource,
    KafkaSource,
    PubSubSource,
    Source,
    check_source,
    checked_duration,
)

RAW_BOOKKEEPING = ("record_id", "event_time", "payload", "source_position", "publish_time", "batch_id",
                   "ingested_at", "time_bucket")
"""Columns onceflow adds to the raw table; a schema field cannot have these names."""
INGEST_COLUMNS = ("ordinal", "attributes", "data", "reason", "detail", "raw", "t")
"""Columns a batch carries beside a record's fields while it is validated and deduplicated; a schema field with
one of these names would be mistaken for it (its values lost or taken for onceflow's), so it cannot have them."""
WINDOW_BOOKKEEPING = ("window_start", "window_end", "raw_version", "pane", "timing")
"""Columns onceflow adds to a window table; a transform cannot output these names."""
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

Transform = Callable[[DataFrame], DataFrame]
Delivery = Literal["exactly_once", "at_least_once"]
LatePolicy = Literal["drop", "refire"]
DELIVERY_MODES: tuple[str, ...] = get_args(Delivery)
LATE_POLICIES: tuple[str, ...] = get_args(LatePolicy)


PaneSink = FileSink | BigQuerySink
"""A sink a windowed output publishes its final panes to."""


@dataclass(frozen=True, kw_only=True)
class WindowedOutput:
    """A windowed computation: one Dagster asset, one partition per event-time window, one Delta table.

    `transform` receives one window's valid records (the schema's fields, `record_id`, `event_time`) and
    returns one row per value of `keys` (`keys=[]`: one row per window); it runs on a pinned table version and
    must be deterministic. A window closes when the watermark passes its end plus `allowed_lateness`; late
    records are counted (`drop`) or recompute the window as a new pane (`refire`).
    """

    asset: str
    window: Duration
    transform: Transform
    keys: Sequence[str] = ()
    allowed_lateness: Duration = "0s"
    late_policy: LatePolicy = "drop"
    sinks: Sequence[PaneSink] = ()
    description: str | None = None

    def __post_init__(self) -> None:
        # One key or one sink may be given alone (typed as a list): `keys="region"` is one key, never six.
        object.__setattr__(self, "keys", _as_tuple(self.keys, str))
        object.__setattr__(self, "sinks", _as_tuple(self.sinks, FileSink | BigQuerySink))
        for name in ("window", "allowed_lateness"):
            object.__setattr__(self, name, normal_duration(getattr(self, name)))

    @property
    def window_s(self) -> int:
        return parse_duration(self.window)

    @property
    def allowed_lateness_s(self) -> int:
        return parse_duration(self.allowed_lateness)

    @property
    def table(self) -> str:
        return f"windows/{self.asset}"


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """A source, its record schema, its delivery mode and its windowed outputs; see the module docstring.

    `schema` is a Spark DDL string of the payload's fields, each record validated against it. `dedup_horizon`
    bounds how far back record IDs are checked (older records are dead letters). An event time more than
    `max_clock_skew` ahead of the batch is a dead letter. `start_date` (`YYYY-MM-DD`, UTC) is the first window
    of every output's partitions. `retention` is how long the Delta tables keep old versions: a closed window can
    be recomputed from its pinned input (a retry, a backfill) for that long after it closed, and no longer.
    `max_dead_letter_rate` (a fraction, 0.01 for 1 %), when set, is the most of a batch's records that may be dead
    letters before the raw asset's check `dead_letter_rate` fails (the records are kept either way).
    `time_bucket` is the raw table's partition by event time (at least a minute): the unit the dedup horizon prunes
    by, and each bucket a batch touches is a file it writes. An hour suits a live stream; a backfill whose batches
    span months wants a day. A table keeps the width it was made with.
    """

    name: str
    source: Source
    schema: str | T.StructType
    outputs: Sequence[WindowedOutput | RecordOutput] = ()
    delivery: Delivery = "exactly_once"
    dedup_horizon: Duration = "1d"
    max_clock_skew: Duration = "1h"
    max_record_bytes: int = 64 * 1024
    start_date: str = "2026-11-01"
    retention: Duration = "30d"
    time_bucket: Duration = "1h"
    watermark_band: Duration | None = None
    watermark_idle: Duration | None = None
    max_dead_letter_rate: float | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", _as_tuple(self.outputs, WindowedOutput | RecordOutput))
        if isinstance(self.schema, T.StructType) and self.schema.fields:
            object.__setattr__(self, "schema", schema_ddl(self.schema))  # one form: the DDL the tables record
        for name in ("dedup_horizon", "max_clock_skew", "retention", "time_bucket", "watermark_band",
                     "watermark_idle"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, normal_duration(getattr(self, name)))
        _check_pipeline(self)

    @cached_property
    def record_schema(self) -> T.StructType:
        return parse_schema(self.schema)

    @property
    def source_id(self) -> str:
        """Names the source in checkpoints and is the Delta `txnAppId` of its commits."""
        return f"{self.name}/{self.source.kind}"

    @property
    def raw_table(self) -> str:
        return f"raw/{self.name}"

    @property
    def dead_letter_table(self) -> str:
        return f"dead_letter/{self.name}"

    @property
    def dedup_horizon_s(self) -> int:
        return parse_duration(self.dedup_horizon)

    @property
    def max_clock_skew_s(self) -> int:
        return parse_duration(self.max_clock_skew)

    @property
    def retention_s(self) -> int:
        return parse_duration(self.retention)

    @property
    def time_bucket_ms(self) -> int:
        return parse_duration(self.time_bucket) * 1000

    @property
    def windowed_outputs(self) -> tuple[WindowedOutput, ...]:
        return tuple(o for o in self.outputs if isinstance(o, WindowedOutput))

    @property
    def record_outputs(self) -> tuple[RecordOutput, ...]:
        return tuple(o for o in self.outputs if isinstance(o, RecordOutput))

    def output(self, asset: str) -> WindowedOutput:
        return next(o for o in self.windowed_outputs if o.asset == asset)

    def record_output(self, asset: str) -> RecordOutput:
        return next(o for o in self.record_outputs if o.asset == asset)


def _as_tuple(value: Any, single: type | Any) -> tuple:
    """`value` as a tuple: a lone `single` (or anything not iterable, for the checks to name) as one member."""
    if isinstance(value, single):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        return (value,)


def _check_pipeline(p: Pipeline) -> None:
    def fail(where: str, problem: str) -> None:
        raise DeclarationError(f"pipeline {p.name!r}: {where}: {problem}")

    if not isinstance(p.name, str) or not _NAME.match(p.name):
        raise DeclarationError(f"pipeline {p.name!r}: name: use lowercase letters, digits and '_', starting with a letter")
    if not isinstance(p.source, PubSubSource | FileSource | KafkaSource):
        fail("source", f"{type(p.source).__name__} is not a source: use FileSource, PubSubSource or KafkaSource")
    check_source(p.source, fail)
    try:
        fields = p.record_schema
    except SchemaError as error:
        fail("schema", str(error))
    # A source may keep more of a record than the common columns (Kafka: its key and headers).
    reserved = (*RAW_BOOKKEEPING, *p.source.bookkeeping.names, *INGEST_COLUMNS)
    for f in fields:
        if f.name.lower() in reserved:
            fail("schema", f"field {f.name!r} is a column name onceflow uses itself ({', '.join(reserved)})")
    if p.delivery not in DELIVERY_MODES:
        fail("delivery", f"{p.delivery!r} is not a delivery mode: use {' or '.join(map(repr, DELIVERY_MODES))}")
    for name in ("dedup_horizon", "max_clock_skew", "retention", "watermark_band", "watermark_idle"):
        value = getattr(p, name)
        if value is not None:
            checked_duration(value, name, fail)
    if checked_duration(p.time_bucket, "time_bucket", fail) < 60:
        fail("time_bucket", f"{p.time_bucket!r}: a bucket is at least a minute (each is a partition of the raw table)")
    if checked_duration(p.retention, "retention", fail) < 3600:
        fail("retention", f"{p.retention!r}: keep versions at least an hour (a window's recompute needs them)")
    rate = p.max_dead_letter_rate
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1):
        fail("max_dead_letter_rate", f"{rate!r}: give a fraction of a batch's records, from 0 to 1 (0.01 is 1 %)")
    if not isinstance(p.max_record_bytes, int) or p.max_record_bytes < 1:
        fail("max_record_bytes", f"{p.max_record_bytes!r} must be a positive number of bytes")
    try:
        datetime.strptime(p.start_date, "%Y-%m-%d")
    except (TypeError, ValueError):
        fail("start_date", f"{p.start_date!r} is not a date YYYY-MM-DD")
    assets = [getattr(o, "asset", None) for o in p.outputs]
    for index, output in enumerate(p.outputs):
        where = f"outputs[{index}]"
        if not isinstance(output, WindowedOutput | RecordOutput):
            fail(where, f"{type(output).__name__} is not an output: use WindowedOutput or RecordOutput")
        if not isinstance(output.asset, str) or not _NAME.match(output.asset):
            fail(f"{where}.asset", "use lowercase letters, digits and '_', starting with a letter")
        if isinstance(output, RecordOutput):
            check_record_output(output, f"{where} ({output.asset!r})", fail)
        else:
            _check_output(output, f"{where} ({output.asset!r})", fail)
        if assets.count(output.asset) > 1:
            fail(f"{where}.asset", f"{output.asset!r} is declared twice")


def _check_output(o: WindowedOutput, where: str, fail: Callable[[str, str], None]) -> None:
    seconds = checked_duration(o.window, f"{where}.window", fail)
    try:
        check_window_size(seconds)
    except ValueError as error:
        fail(f"{where}.window", f"{o.window!r}: {error}")
    checked_duration(o.allowed_lateness, f"{where}.allowed_lateness", fail)
    if o.late_policy not in LATE_POLICIES:
        fail(f"{where}.late_policy", f"{o.late_policy!r} is not a late policy: use 'drop' or 'refire'")
    if not callable(o.transform):
        fail(f"{where}.transform", f"{o.transform!r} is not a function of a DataFrame")
    for key in o.keys:
        if not isinstance(key, str) or not IDENTIFIER.match(key):
            fail(f"{where}.keys", f"{key!r} is not a column name")
        if key in WINDOW_BOOKKEEPING:
            fail(f"{where}.keys", f"{key!r} is a column onceflow adds itself")
    for kind in (FileSink, BigQuerySink):
        if sum(isinstance(sink, kind) for sink in o.sinks) > 1:
            fail(f"{where}.sinks", f"more than one {kind.__name__}: an output publishes to one of each")
    for index, sink in enumerate(o.sinks):
        if not isinstance(sink, FileSink | BigQuerySink):
            fail(f"{where}.sinks[{index}]", f"{type(sink).__name__} is not a sink: use FileSink or BigQuerySink")
        if isinstance(sink, FileSink) and sink.format != "jsonl":
            fail(f"{where}.sinks[{index}].format", f"{sink.format!r}: window panes are published as 'jsonl'")
        if isinstance(sink, BigQuerySink):
            for problem in sink.problems():
                fail(f"{where}.sinks[{index}]", problem)
