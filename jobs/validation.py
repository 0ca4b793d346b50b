"""Parse and validate landed records against a pipeline's record contract, in Spark (no Python per record).

`classify` adds to a landed batch (`ordinal, source_position, publish_time, attributes, data`) the columns
`payload` (the record as text), `record_id`, `event_time`, one typed column per schema field, and `reason` /
`detail`: NULL for a valid record, else why it is a dead letter. The first failing check names the reason:

- `oversized` (more than `max_record_bytes`), `not_json` (not UTF-8, not JSON, or not a JSON object);
- per schema field, in order: `missing_field` (absent or null but NOT NULL), `wrong_type` (a JSON value of
  another kind, e.g. a string for a DECIMAL, or a timestamp string that does not parse), `out_of_range` (the
  right kind but it does not fit, e.g. 300 for a TINYINT or 1e40 for a DECIMAL(38, 9));
- `missing_event_time`, `bad_event_time` (neither RFC 3339 nor epoch milliseconds);
- `event_time_out_of_range` (more than `max_clock_skew` after the batch time), `beyond_dedup_horizon` (before
  the batch's horizon floor: it can no longer be checked against the dedup catalog).

`detail` names the field and what was found. Replays classify identically: the batch time and the horizon floor
come from the batch plan, never from the clock.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.batch_values import with_batch_values
from jobs.declaration import FileSource, Pipeline
from jobs.schema import INTEGRAL, quoted

_BATCH_COLUMNS = ("_batch_time_ms", "_latest_ms", "_floor_ms", "_batch_time", "_latest", "_floor")
NUMERIC_VARIANT = ("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE")
INTEGRAL_VARIANT = ("TINYINT", "SMALLINT", "INT", "BIGINT")


@dataclass(frozen=True)
class RecordContract:
    """Where a record's ID and event time come from, the payload schema, and the limits a record must keep.

    IDs and times come from a message attribute or a payload field; without one (or on a record that lacks it)
    the ID is the record's source position and the time is the publish time (when `time_from_publish`).
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
        return cls(
            **common, id_attribute=source.id_attribute, time_attribute=source.timestamp_attribute,
            time_from_publish=True,
        )


def parse_time(text: Column) -> Column:
    """A time string as a TIMESTAMP: up to 15 digits are epoch milliseconds, anything else RFC 3339; else NULL."""
    return F.when(text.rlike(r"^-?[0-9]{1,15}$"), F.timestamp_millis(text.cast("bigint"))).otherwise(
        F.try_to_timestamp(text)
    )


def _field_value(index: int, data_type: T.DataType) -> Column:
    """The field (its JSON value, column `_json_<index>`) as `data_type`, NULL where it is absent or does not fit."""
    value = F.col(_json_column(index))
    if isinstance(data_type, T.TimestampType):
        return parse_time(F.try_variant_get(value, "$", "string"))
    if isinstance(data_type, T.VariantType):
        return value
    return F.try_variant_get(value, "$", data_type.simpleString())


def _kind_fits(kind: Column, data_type: T.DataType) -> Column:
    """Whether a JSON value of variant kind `kind` (`schema_of_variant`) is the kind `data_type` takes."""
    numeric = kind.isin(*NUMERIC_VARIANT) | kind.startswith("DECIMAL")
    if isinstance(data_type, T.StringType | T.DateType | T.TimestampNTZType):
        return kind == "STRING"
    if isinstance(data_type, T.TimestampType):
        return (kind == "STRING") | kind.isin(*INTEGRAL_VARIANT)
    if isinstance(data_type, T.BooleanType):
        return kind == "BOOLEAN"
    if isinstance(data_type, INTEGRAL):
        # 5 and 5.0 are integers; 5.5 is not (a cast would silently truncate it).
        return kind.isin(*INTEGRAL_VARIANT) | kind.rlike(r"^DECIMAL\([0-9]+,0\)$")
    if isinstance(data_type, T.DecimalType | T.FloatType | T.DoubleType):
        return numeric
    if isinstance(data_type, T.ArrayType):
        return kind.startswith("ARRAY")
    if isinstance(data_type, T.MapType | T.StructType):
        return kind.startswith("OBJECT")
    return F.lit(True)  # VARIANT takes any JSON value


def _kind_column(index: int) -> str:
    return f"_kind_{index}"


def _json_column(index: int) -> str:
    return f"_json_{index}"


def _field_checks(schema: T.StructType) -> list[tuple[Column, str, Column]]:
    checks = []
    for index, field in enumerate(schema):
        name, declared = field.name, field.dataType.simpleString().upper()
        kind = F.col(_kind_column(index))
        absent = kind.isNull() | (kind == "VOID")
        value = F.col(name)
        if not field.nullable:
            checks.append((absent, "missing_field", F.lit(f"`{name}` is missing or null; it is {declared} NOT NULL")))
        fits = _kind_fits(kind, field.dataType)
        checks.append(
            (~absent & ~fits, "wrong_type", F.format_string(f"`{name}` is %s, not {declared}", kind))
        )
        temporal = isinstance(field.dataType, T.DateType | T.TimestampType | T.TimestampNTZType)
        checks.append(
            (
                ~absent & value.isNull(),
                "wrong_type" if temporal else "out_of_range",
                F.format_string(
                    f"`{name}` %s %s does not fit {declared}",
                    kind,
                    F.substring(F.try_variant_get(_json_column(index), "$", "string"), 1, 60),
                ),
            )
        )
    return checks


def classify(
    landed: DataFrame, contract: RecordContract, batch_time_ms: int, horizon_floor_ms: int | None, **batch: int
) -> DataFrame:
    """Parse and validate every landed record; see the module docstring for the columns added. `batch` names
    further numbers of the batch (its id, say) to add as columns, the same on every row."""
    df = with_batch_values(
        landed, _batch_time_ms=batch_time_ms, _latest_ms=batch_time_ms + contract.max_clock_skew_ms,
        _floor_ms=horizon_floor_ms or 0, **batch,
    )
    # Spark Connect's columns and a classic session's are different objects: each kind is built once.
    for stage in _stages(contract, horizon_floor_ms is not None, connect=not hasattr(landed, "_jdf")):
        df = df.withColumns(stage)
    per_field = {name(index) for index in range(len(contract.schema)) for name in (_kind_column, _json_column)}
    internal = {"v", "_top", "_bytes", "_time_raw", "_verdict", *_BATCH_COLUMNS, *per_field}
    # Naming the verdict's parts and dropping the internal columns is one projection (each costs an analysis),
    # written as SQL text: each column built in Python costs round trips to the JVM.
    kept = [quoted(name) for name in df.columns if name not in internal]
    return df.selectExpr(*kept, "_verdict.reason AS reason", "_verdict.detail AS detail")


@functools.cache
def _stages(contract: RecordContract, with_floor: bool, connect: bool) -> tuple[dict[str, Column], ...]:
    """The columns `classify` adds, stage by stage (each stage reads only the ones before it).

    Built once per contract: a batch's own values (its time, its horizon floor) are columns of the batch, so
    the expressions are the same for every batch and none is rebuilt (each costs Spark calls from Python).
    """
    limit = contract.max_record_bytes
    fallback = F.col("publish_time") if contract.time_from_publish else F.lit(None).cast("timestamp")
    # Each field's JSON value is looked up in the record once; its kind and typed value are read from that.
    fields = {_json_column(index): F.variant_get("v", f"$.{field.name}", "variant")
              for index, field in enumerate(contract.schema)}
    parsed = {
        # A valid JSON text is an object exactly when it starts with "{": no need to type the whole record.
        "_top": F.when(F.col("v").isNull(), F.lit(None))
        .when(F.expr("startswith(ltrim(' \\t\\r\\n', payload), '{')"), F.lit("OBJECT"))
        .otherwise(F.schema_of_variant("v")),
        "record_id": F.coalesce(_located(contract.id_attribute, contract.id_field), F.col("source_position")),
        "_time_raw": _located(contract.time_attribute, contract.time_field),
    }
    for index, field in enumerate(contract.schema):
        parsed[field.name] = _field_value(index, field.dataType)
        parsed[_kind_column(index)] = F.schema_of_variant(_json_column(index))
    event_time = F.col("event_time")
    checks: list[tuple[Column, str, Column]] = [
        (F.col("_bytes") > limit, "oversized", F.format_string(f"record is %d bytes; the limit is {limit}", "_bytes")),
        (F.col("payload").isNull(), "not_json", F.lit("payload is not valid UTF-8")),
        (
            F.col("_top").isNull() | ~F.col("_top").startswith("OBJECT"),
            "not_json",
            F.when(F.col("_top").isNull(), F.lit("payload is not JSON")).otherwise(
                F.format_string("payload is JSON %s, not an object", "_top")
            ),
        ),
        *_field_checks(contract.schema),
        (event_time.isNull() & F.col("_time_raw").isNull(), "missing_event_time", F.lit("no event time")),
        (
            event_time.isNull(),
            "bad_event_time",
            F.format_string("event time %s is neither RFC 3339 nor epoch milliseconds", F.substring("_time_raw", 1, 60)),
        ),
        (
            event_time > F.col("_latest"),
            "event_time_out_of_range",
            F.format_string(
                f"event time %s is more than {contract.max_clock_skew_ms // 1000}s after the batch time %s",
                event_time.cast("string"),
                F.col("_batch_time").cast("string"),
            ),
        ),
    ]
    if with_floor:
        checks.append(
            (
                event_time < F.col("_floor"),
                "beyond_dedup_horizon",
                F.format_string(
                    "event time %s is older than the dedup horizon (%s)", event_time.cast("string"),
                    F.col("_floor").cast("string"),
                ),
            )
        )
    # One chain of conditions gives both the reason and its detail: each check is evaluated once per record.
    verdict = F.struct(F.lit(None).cast("string").alias("reason"), F.lit(None).cast("string").alias("detail"))
    for condition, name, text in reversed(checks):
        verdict = F.when(condition, F.struct(F.lit(name).alias("reason"), text.alias("detail"))).otherwise(verdict)
    return (
        {"_bytes": F.length("data"), "payload": F.expr("try_validate_utf8(cast(data AS STRING))"),
         **{name: F.timestamp_millis(f"{name}_ms") for name in ("_batch_time", "_latest", "_floor")}},
        {"v": F.when(F.col("_bytes") <= limit, F.try_parse_json("payload"))},
        fields,
        parsed,
        {"event_time": F.when(F.col("_time_raw").isNull(), fallback).otherwise(parse_time(F.col("_time_raw")))},
        {"_verdict": verdict},
    )


def _located(attribute: str | None, field: str | None) -> Column:
    """A string from a message attribute or a payload field (numbers become their text); NULL when absent."""
    if attribute is not None:
        return F.element_at(F.col("attributes"), F.lit(attribute))
    if field is not None:
        return F.try_variant_get("v", f"$.{field}", "string")
    return F.lit(None).cast("string")
