"""Parse and validate landed records against a pipeline's record contract, in Spark (no Python per record).

`classify` adds to a landed batch (`ordinal, source_position, publish_time, attributes`; its `data` is dropped) the
columns `payload` (the record as text), `record_id`, `event_time`, one typed column per schema field, `reason` /
`detail`: NULL for a valid record, else why it is a dead letter, and `raw`: a dead letter's record as text (its
payload, or base64 of bytes that are not UTF-8). The first failing check names the reason:

- `oversized` (more than `max_record_bytes`), `not_json` (not UTF-8, not JSON, or not a JSON object);
- per schema field, in order (see `onceflow.jobs.ingest.record_fields`: Spark's JSON reader converts, onceflow is stricter in a
  few places): `missing_field` (absent or null but NOT NULL, also inside a STRUCT), `wrong_type` (a JSON value
  Spark's reader does not convert to the type, e.g. `"abc"` or `true` for a DECIMAL, `5.5` for an INT, a time
  string that does not parse), `out_of_range` (it does not fit, e.g. 300 for a TINYINT, 1e40 for a FLOAT,
  `"1.234"` for a DECIMAL(18, 2)); `detail` names the failing value's path, `items[2].price`;
- `missing_event_time`, `bad_event_time` (neither RFC 3339 nor epoch milliseconds);
- `event_time_out_of_range` (more than `max_clock_skew` after the batch time), `beyond_dedup_horizon` (before
  the batch's horizon floor: it can no longer be checked against the dedup catalog).

`detail` says what was found. Replays classify identically: the batch time and the horizon floor
come from the batch plan, never from the clock.
"""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.declare.schema import quoted, type_ddl
from onceflow.jobs.ingest.local_projection import LocalProjection, evaluated_on_driver
from onceflow.jobs.ingest.record_fields import OPTIONS, failure, narrowed, not_an_object, strict, wide
from onceflow.jobs.sources.batch_values import with_batch_values
from onceflow.resources.plan_template import PlanTemplate
from onceflow.resources.spark_functions import JSON_RECORD, UTF8_TEXT, compiled_functions

FLAGGED = "flagged"
"""The reason `classify` gives a record whose fields failed the conversion or onceflow's stricter checks, until
`explain_flagged` says which value failed and how."""
_BATCH_COLUMNS = ("_batch_time_ms", "_latest_ms", "_floor_ms", "_has_floor", "_batch_time", "_latest", "_floor")


def parse_time(text: Column) -> Column:
    """A time string as a TIMESTAMP: up to 15 digits are epoch milliseconds, anything else RFC 3339; else NULL."""
    return F.when(text.rlike(r"^-?[0-9]{1,15}$"), F.timestamp_millis(text.cast("bigint"))).otherwise(
        F.try_to_timestamp(text)
    )


def _record_schema(contract: RecordContract) -> str:
    """The DDL `from_json` reads a record with: the schema's fields (see `onceflow.jobs.ingest.record_fields.wide`), the ID and
    time fields that are not among them as STRING, and the corrupt-record column."""
    declared = {f.name for f in contract.schema}
    located = [name for name in (contract.id_field, contract.time_field) if name and name not in declared]
    return ", ".join([*(f"{quoted(f.name)} {type_ddl(wide(f.dataType))}" for f in contract.schema),
                      *(f"{quoted(name)} STRING" for name in dict.fromkeys(located)), "_corrupt STRING"])


def _flagged(contract: RecordContract) -> str:
    """SQL: whether the record (`_rec`) has a value Spark did not convert, one onceflow refuses, or misses a NOT NULL
    field: only then is `onceflow.jobs.ingest.record_fields.failure` worked out."""
    conditions = ["_rec IS NULL", "_rec._corrupt IS NOT NULL"]
    for field in contract.schema:
        value = f"_rec.{quoted(field.name)}"
        if not field.nullable:
            conditions.append(f"{value} IS NULL")
        check = strict(field.dataType, value)
        if check is not None:
            conditions.append(f"NOT {check}")
    return f"payload IS NOT NULL AND _bytes <= {contract.max_record_bytes} AND ({' OR '.join(conditions)})"


def classify(
    landed: DataFrame, contract: RecordContract, batch_time_ms: int, horizon_floor_ms: int | None, **batch: int
) -> DataFrame:
    """Parse and validate every landed record; see the module docstring for the columns added. `batch` names
    further numbers of the batch (its id, say) to add as columns, the same on every row."""
    numbers = batch_numbers(contract, batch_time_ms, horizon_floor_ms, **batch)
    return classify_numbered(landed, contract, numbers)


def batch_numbers(
    contract: RecordContract, batch_time_ms: int, horizon_floor_ms: int | None, **batch: int
) -> dict[str, int]:
    """The numbers of a batch that `classify` adds as columns (`batch`'s after its own), by name. Whether the batch
    has a horizon floor is a number too (`_has_floor`, 1 or 0), not a different plan: every batch of every
    delivery mode then runs the same generated code, which the JVM compiles (and warms) once."""
    return {"_batch_time_ms": batch_time_ms, "_latest_ms": batch_time_ms + contract.max_clock_skew_ms,
            "_floor_ms": horizon_floor_ms or 0, "_has_floor": int(horizon_floor_ms is not None), **batch}


def classify_numbered(landed: DataFrame, contract: RecordContract, numbers: dict[str, int]) -> DataFrame:
    """`classify`, given the batch's `numbers` (`batch_numbers`): its plan depends on nothing else of the batch
    (`onceflow.resources.plan_template`)."""
    compiled = compiled_functions(landed.sparkSession)  # then the batch reads with `JSON_RECORD` and `UTF8_TEXT`
    df = with_batch_values(landed, **numbers)
    # Spark Connect's columns and a classic session's are different objects: each kind is built once.
    for stage in _stages(contract, connect=not hasattr(landed, "_jdf"), compiled=compiled):
        df = df.withColumns(stage)
    internal = {"data", "_rec", "_flag", "_bytes", "_undecoded", "_time_raw", "_verdict", *_BATCH_COLUMNS}
    # Naming the verdict's parts and dropping the internal columns is one projection (each costs an analysis),
    # written as SQL text: each column built in Python costs round trips to the JVM.
    kept = [quoted(name) for name in df.columns if name not in internal]
    return df.selectExpr(
        *kept, "_verdict.reason AS reason", "_verdict.detail AS detail",
        "CASE WHEN _verdict.reason IS NOT NULL THEN coalesce(payload, _undecoded) END AS raw",
    )


def explain_flagged(spark: SparkSession, contract: RecordContract, rows: pa.Table) -> pa.Table:
    """`rows` (classified records held here, `reason, detail, raw, record_id, event_time` among their columns) with
    each `FLAGGED` record's reason and detail replaced by what failed: `not_json` for a payload that is not a JSON
    object (`onceflow.jobs.ingest.record_fields.not_an_object`), else its first value that failed
    (`onceflow.jobs.ingest.record_fields.failure`); and its ID and event time read again from its payload (the
    conversion stops at the value it cannot convert, and may have lost them).

    Only when there are some, and over the flagged records' payloads only: in the batch's own plan, those
    expressions cost every batch a tenth of a second to analyze, and a copy of each of its rows (Spark does not
    compile them into its stage), whether or not a record was flagged. On a classic session they are evaluated on
    the driver (`LocalProjection`, where a Spark job spent nearly all its time analysing and planning them again);
    over Spark Connect, on the server's driver in the same way
    (`evaluated_on_driver`) where onceflow started the server, else by a second Spark job. Even the
    question whether a payload is a JSON object at all is asked here, not in the batch's plan: it is a second
    `from_json`, which Spark does not compile either, and in the plan it cost every batch a copy of its rows."""
    mask = pc.fill_null(pc.equal(rows["reason"], FLAGGED), False).combine_chunks()
    if not pc.any(mask).as_py():
        return rows
    few = rows.filter(mask)
    asked = pa.table({"payload": few["raw"], "record_id": few["record_id"], "event_time": few["event_time"],
                      "_i": pa.array(range(few.num_rows), pa.int64())})
    if hasattr(spark, "_jsparkSession"):
        explained = _local_explanation(spark, contract, PlanTemplate.settings(spark))(asked)
    else:
        projected = spark.createDataFrame(asked).select(*_explanation(contract, connect=True))
        explained = (evaluated_on_driver(projected) if compiled_functions(spark) else projected.toArrow()).sort_by("_i")
    for name in ("reason", "detail", "record_id", "event_time"):
        at = rows.schema.get_field_index(name)
        kind = rows.schema.field(at).type
        column = pc.replace_with_mask(rows[name].combine_chunks(), mask, explained[name].cast(kind).combine_chunks())
        rows = rows.set_column(at, rows.schema.field(at), column)
    return rows


_ASKED = T.StructType([T.StructField("payload", T.StringType()), T.StructField("record_id", T.StringType()),
                       T.StructField("event_time", T.TimestampType()), T.StructField("_i", T.LongType())])


@functools.lru_cache(maxsize=8)
def _local_explanation(spark: SparkSession, contract: RecordContract, settings: str) -> LocalProjection:
    """The explanation, analysed and optimized once for the session `spark` with its `settings`."""
    return LocalProjection(spark, _ASKED, _explanation(contract, connect=False))


@functools.cache
def _explanation(contract: RecordContract, connect: bool) -> tuple[Column, ...]:
    """The columns `explain_flagged` asks Spark for, from a flagged record's `payload, record_id, event_time`."""
    _, id_text = _located(contract, contract.id_attribute, contract.id_field)
    _, time_text = _located(contract, contract.time_attribute, contract.time_field)
    found = F.expr(f"coalesce({not_an_object()}, {failure(contract.schema)})")
    return (
        found.getField("reason").alias("reason"), found.getField("detail").alias("detail"),
        # An empty ID is none (`_invalid_id`). Not `nullif`: the driver-side projection loops on it.
        F.col("record_id") if id_text is None else F.coalesce(F.when(id_text != "", id_text), F.col("record_id"))
        .alias("record_id"),
        F.col("event_time") if time_text is None else F.when(time_text.isNull(), F.col("event_time")).otherwise(
            parse_time(time_text)).alias("event_time"),
        F.col("_i"),
    )


@functools.cache
def _stages(contract: RecordContract, connect: bool, compiled: bool) -> tuple[dict[str, Column], ...]:
    """The columns `classify` adds, stage by stage (each stage reads only the ones before it).

    Built once per contract: a batch's own values (its time, its horizon floor) are columns of the batch, so
    the expressions are the same for every batch and none is rebuilt (each costs Spark calls from Python).
    """
    limit = contract.max_record_bytes
    # Spark's own functions, in forms Spark compiles into the stage (`JSON_RECORD`, `UTF8_TEXT`) where the session
    # has them.
    reader = JSON_RECORD if compiled else "from_json"
    decoded = f"{UTF8_TEXT}(data)" if compiled else "try_validate_utf8(cast(data AS STRING))"
    fallback = F.col("publish_time") if contract.time_from_publish else F.lit(None).cast("timestamp")
    # The record is read once, by Spark's JSON reader; only a flagged record (rare) is looked at again.
    parsed = {f.name: F.expr(narrowed(f.dataType, f"_rec.{quoted(f.name)}")) for f in contract.schema}
    id_read, _ = _located(contract, contract.id_attribute, contract.id_field)
    time_read, _ = _located(contract, contract.time_attribute, contract.time_field)
    event_time = F.col("event_time")
    checks: list[tuple[Column, str | Column, Column]] = [
        (F.col("_bytes") > limit, "oversized", F.format_string(f"record is %d bytes; the limit is {limit}", "_bytes")),
        # A landing row without bytes stands for records the source lost before they were read (see landing.py).
        (F.col("_bytes").isNull(), "lost_in_source",
         F.format_string("records %s were deleted from the source before onceflow read them", "source_position")),
        _invalid_id(contract),
        (F.col("payload").isNull(), "not_json", F.lit("payload is not valid UTF-8")),
        (F.col("_flag"), FLAGGED, F.lit(None)),  # `explain_flagged` says what failed
        (event_time.isNull() & F.col("_time_raw").isNull(), "missing_event_time", F.lit("no event time")),
        (
            event_time.isNull(),
            "bad_event_time",
            F.format_string("event time %s is neither RFC 3339 nor epoch milliseconds", F.substring("_time_raw", 1, 60)),
        ),
        _time_range(contract),
    ]
    # One chain of conditions gives both the reason and its detail: each check is evaluated once per record.
    verdict = F.struct(F.lit(None).cast("string").alias("reason"), F.lit(None).cast("string").alias("detail"))
    for condition, name, text in reversed(checks):
        reason = F.lit(name) if isinstance(name, str) else name
        verdict = F.when(condition, F.struct(reason.alias("reason"), text.alias("detail"))).otherwise(verdict)
    return (
        {"_bytes": F.length("data"), "payload": F.expr(decoded),
         **{name: F.timestamp_millis(f"{name}_ms") for name in ("_batch_time", "_latest", "_floor")}},
        {"_rec": F.expr(
            f"CASE WHEN _bytes <= {limit} THEN {reader}(payload, '{_record_schema(contract)}', {OPTIONS}) END"),
         # A dead letter's record as text (see `classify`): the only use of the bytes past here.
         "_undecoded": F.expr("CASE WHEN payload IS NULL THEN base64(data) END")},
        {"_flag": F.expr(_flagged(contract)), **parsed},
        # An empty ID is none (`_invalid_id`): the record keeps its position, never one ID shared by all such.
        {"record_id": F.coalesce(F.when(id_read != "", id_read), F.col("source_position")), "_time_raw": time_read},
        {"event_time": F.when(F.col("_time_raw").isNull(), fallback).otherwise(parse_time(F.col("_time_raw")))},
        {"_verdict": verdict},
    )


def _invalid_id(contract: RecordContract) -> tuple[Column, str, Column]:
    """The check that a declared ID attribute (a Kafka header), where a record has it, holds an ID: present with no
    value (a null header), not UTF-8 (read as NULL, `onceflow.jobs.sources.kafka_reader`) or empty is `invalid_id`;
    so is an empty ID field. A record without the attribute or field at all is identified by its position."""
    if contract.id_attribute is not None:
        name = contract.id_attribute
        value = F.element_at(F.col("attributes"), F.lit(name))
        present = F.coalesce(F.expr(f"map_contains_key(attributes, '{name}')"), F.lit(False))
        return present & (value.isNull() | (value == "")), "invalid_id", F.lit(
            f"the ID attribute {name!r} has no value, an empty one, or one that is not UTF-8")
    if contract.id_field is not None:
        id_read, _ = _located(contract, None, contract.id_field)
        return F.coalesce(id_read == "", F.lit(False)), "invalid_id", F.lit(f"the ID field {contract.id_field!r} is empty")
    return F.lit(False), "invalid_id", F.lit(None).cast("string")


def _time_range(contract: RecordContract) -> tuple[Column, Column, Column]:
    """The check that the event time is at most `max_clock_skew` after the batch time and, where the batch has a
    horizon floor, not before it: one check, so the event time's text appears once in the chain. Spark evaluates for every
    record, ahead of the chain, a value that two of its branches share (its common subexpressions): a time as text
    in two details cost a tenth of a clean batch."""
    event_time = F.col("event_time")
    late = event_time > F.col("_latest")
    reason = F.when(late, F.lit("event_time_out_of_range")).otherwise(F.lit("beyond_dedup_horizon"))
    pattern = F.when(
        late, F.lit(f"event time %s is more than {contract.max_clock_skew_ms // 1000}s after the batch time %s")
    ).otherwise(F.lit("event time %s is older than the dedup horizon (%s)"))
    bound = F.when(late, F.col("_batch_time")).otherwise(F.col("_floor")).cast("string")
    detail = F.call_function("format_string", pattern, event_time.cast("string"), bound)  # a pattern per record
    return late | ((F.col("_has_floor") == 1) & (event_time < F.col("_floor"))), reason, detail


def _located(contract: RecordContract, attribute: str | None, field: str | None) -> tuple[Column, Column | None]:
    """A string from a message attribute or a payload field (a number's or an object's text), NULL when absent: as
    read for every record, and as read again from a flagged one's `payload` (None: nothing to read again)."""
    if attribute is not None:
        return F.element_at(F.col("attributes"), F.lit(attribute)), None
    if field is None:
        return F.lit(None).cast("string"), None
    alone = f"from_json(payload, '{quoted(field)} STRING', {OPTIONS}).{quoted(field)}"
    declared = {f.name: f.dataType for f in contract.schema}
    if isinstance(declared.get(field, T.StringType()), T.StringType):
        # Read with the record; a flagged record may have lost it (Spark stops at a value it cannot convert).
        return F.expr(f"_rec.{quoted(field)}"), F.expr(alone)
    return F.expr(f"CASE WHEN _bytes <= {contract.max_record_bytes} THEN {alone} END"), None
