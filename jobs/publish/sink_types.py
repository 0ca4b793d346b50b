"""How a window table's column types reach the sinks: each Spark type's sink type, and its values' JSON form.

A column's sink type is written in BigQuery's type syntax (`INT64`, `ARRAY<STRUCT<sku STRING, price NUMERIC>>`,
`JSON`), plus `MAP<STRING, T>` (a JSON column): it gives the BigQuery column, and says how the file sink writes
the column's values. The published JSON lines are what a BigQuery load reads, byte for byte, so one form serves
both:

| Spark type                | JSON in a published file                         | BigQuery                     |
|---------------------------|--------------------------------------------------|------------------------------|
| STRING                    | string                                           | STRING                       |
| TINYINT .. BIGINT         | number                                           | INT64                        |
| FLOAT, DOUBLE             | number                                           | FLOAT64                      |
| BOOLEAN                   | true / false                                     | BOOL                         |
| DECIMAL(p, s)             | string of the exact digits, scale kept ("0.50")  | NUMERIC, or BIGNUMERIC when s > 9 or p - s > 29 |
| DATE                      | "2026-11-21"                                     | DATE                         |
| TIMESTAMP                 | "2026-11-21T08:05:03.123456Z" (UTC, microseconds) | TIMESTAMP                   |
| TIMESTAMP_NTZ             | "2026-11-21T10:05:03.500000" (no zone)           | DATETIME                     |
| ARRAY<T>                  | array                                            | T, mode REPEATED             |
| STRUCT<...>               | object, fields in order                          | RECORD                       |
| MAP<STRING, T>            | object                                           | JSON                         |
| VARIANT                   | its JSON value, numbers as written               | JSON                         |

DECIMAL is a string because JSON readers (BigQuery's JSON type, JavaScript, Python's `json`) read numbers as
binary floating point, which loses digits past the 15th; BigQuery loads a string into NUMERIC exactly. BigQuery has
no MAP: Avro's mapping (a REPEATED RECORD of key and value) would make the file's map an array of pairs, so a map
is a JSON object, in the file and in BigQuery alike. BigQuery arrays cannot hold arrays, so ARRAY<ARRAY<T>> goes
only to the file sink; BigQuery arrays hold no NULL elements either (a load of one fails), and a NULL array reads
back from BigQuery as an empty one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pyspark.sql import types as T

from onceflow.jobs.declare.schema import INTEGRAL

if TYPE_CHECKING:
    from google.cloud import bigquery

SCALARS = frozenset({"STRING", "INT64", "NUMERIC", "BIGNUMERIC", "FLOAT64", "BOOL", "DATE", "TIMESTAMP", "DATETIME",
                     "JSON"})
_ALIASES = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}  # legacy SQL names, in stored sequences
_SCALE = {"NUMERIC": 9, "BIGNUMERIC": 38}  # BigQuery would round finer values, and the checksums would differ
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,299}$")
_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|[<>,])")


@dataclass(frozen=True)
class SinkType:
    """A parsed sink type: `kind` is a scalar BigQuery type, `ARRAY` or `MAP` (with `element`: the type of the
    elements, of the map's values) or `STRUCT` (with `fields`)."""

    kind: str
    element: SinkType | None = None
    fields: tuple[tuple[str, SinkType], ...] = ()

    def __str__(self) -> str:
        if self.kind == "ARRAY":
            return f"ARRAY<{self.element}>"
        if self.kind == "MAP":
            return f"MAP<STRING, {self.element}>"
        if self.kind == "STRUCT":
            return f"STRUCT<{', '.join(f'{name} {kind}' for name, kind in self.fields)}>"
        return self.kind


def sink_type(data_type: T.DataType) -> SinkType:
    """The sink type of a Spark column type; `ValueError` for a type the sinks cannot carry."""
    if isinstance(data_type, T.StringType):
        return SinkType("STRING")
    if isinstance(data_type, INTEGRAL):
        return SinkType("INT64")
    if isinstance(data_type, T.DecimalType):
        # NUMERIC is DECIMAL(38, 9) with 29 integer digits; anything wider needs BIGNUMERIC.
        wide = data_type.scale > 9 or data_type.precision - data_type.scale > 29
        return SinkType("BIGNUMERIC" if wide else "NUMERIC")
    simple = {T.FloatType: "FLOAT64", T.DoubleType: "FLOAT64", T.BooleanType: "BOOL", T.TimestampType: "TIMESTAMP",
              T.TimestampNTZType: "DATETIME", T.DateType: "DATE", T.VariantType: "JSON"}
    if type(data_type) in simple:
        return SinkType(simple[type(data_type)])
    if isinstance(data_type, T.MapType):
        if not isinstance(data_type.keyType, T.StringType):
            raise ValueError(f"{data_type.simpleString()}: a map becomes a JSON object, whose keys are strings")
        return SinkType("MAP", element=sink_type(data_type.valueType))
    if isinstance(data_type, T.ArrayType):
        return SinkType("ARRAY", element=sink_type(data_type.elementType))
    if isinstance(data_type, T.StructType):
        for field in data_type.fields:
            if not _NAME.match(field.name):
                raise ValueError(f"struct field {field.name!r}: name it with letters, digits and '_'")
        return SinkType("STRUCT", fields=tuple((f.name, sink_type(f.dataType)) for f in data_type.fields))
    raise ValueError(
        f"{data_type.simpleString()} has no column type in the sinks (supported: strings, integers, decimals, "
        "floating point, booleans, dates, timestamps, and arrays, structs, maps and variants of them)"
    )


def parse_sink_type(text: str) -> SinkType:
    """The `SinkType` that `str(sink_type)` wrote; `ValueError` for anything else."""
    tokens = _TOKEN.findall(text)
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise ValueError(f"invalid sink type {text!r}")
    parsed, end = _parse(tokens, 0, text)
    if end != len(tokens):
        raise ValueError(f"invalid sink type {text!r}")
    return parsed


def _parse(tokens: list[str], i: int, text: str) -> tuple[SinkType, int]:
    def expect(token: str, at: int) -> int:
        if at >= len(tokens) or tokens[at] != token:
            raise ValueError(f"invalid sink type {text!r}: expected {token!r}")
        return at + 1

    word = tokens[i].upper() if i < len(tokens) else ""
    if word == "ARRAY":
        element, i = _parse(tokens, expect("<", i + 1), text)
        return SinkType("ARRAY", element=element), expect(">", i)
    if word == "MAP":
        i = expect("<", i + 1)
        if tokens[i:i + 1] != ["STRING"]:
            raise ValueError(f"invalid sink type {text!r}: MAP keys are STRING")
        element, i = _parse(tokens, expect(",", i + 1), text)
        return SinkType("MAP", element=element), expect(">", i)
    if word == "STRUCT":
        fields, i = [], expect("<", i + 1)
        while True:
            name = tokens[i] if i < len(tokens) else ""
            if not _NAME.match(name):
                raise ValueError(f"invalid sink type {text!r}: bad field name {name!r}")
            kind, i = _parse(tokens, i + 1, text)
            fields.append((name, kind))
            if tokens[i:i + 1] != [","]:
                return SinkType("STRUCT", fields=tuple(fields)), expect(">", i)
            i += 1
    word = _ALIASES.get(word, word)
    if word not in SCALARS:
        raise ValueError(f"invalid sink type {text!r}: unknown type {tokens[i] if i < len(tokens) else ''!r}")
    return SinkType(word), i + 1


def bigquery_field(name: str, kind: SinkType) -> bigquery.SchemaField:
    """The BigQuery column holding a column of sink type `kind`; `ValueError` if BigQuery has none (an array of
    arrays)."""
    from google.cloud import bigquery

    mode = "NULLABLE"
    if kind.kind == "ARRAY":
        assert kind.element is not None
        if kind.element.kind == "ARRAY":
            raise ValueError(f"column {name!r}: {kind}: BigQuery arrays cannot hold arrays (wrap the inner one in a "
                             "STRUCT)")
        kind, mode = kind.element, "REPEATED"
    if kind.kind == "STRUCT":
        return bigquery.SchemaField(name, "RECORD", mode=mode, fields=[bigquery_field(n, k) for n, k in kind.fields])
    return bigquery.SchemaField(name, "JSON" if kind.kind == "MAP" else kind.kind, mode=mode)


@dataclass(frozen=True)
class RawJson:
    """JSON text that goes into a published line as it is (a VARIANT's value keeps its numbers' digits)."""

    text: str


def json_value(name: str, value: Any, kind: SinkType) -> Any:
    """`value` (as pyarrow's `to_pylist` gives it; a VARIANT as its JSON text) in its published JSON form;
    `ValueError` naming the column path `name` for a value that does not fit `kind`."""
    if value is None:
        return None
    if kind.kind == "ARRAY" and isinstance(value, list | tuple):
        assert kind.element is not None
        return [json_value(f"{name}[{i}]", v, kind.element) for i, v in enumerate(value)]
    if kind.kind == "STRUCT" and isinstance(value, dict) and set(value) == {n for n, _ in kind.fields}:
        return {n: json_value(f"{name}.{n}", value[n], k) for n, k in kind.fields}
    if kind.kind == "MAP" and isinstance(value, list | dict):
        assert kind.element is not None
        pairs = value.items() if isinstance(value, dict) else value  # pyarrow gives a map as (key, value) pairs
        return {k: json_value(f"{name}[{k!r}]", v, kind.element) for k, v in pairs}
    if kind.kind == "JSON":
        return _variant(name, value)
    if kind.kind == "TIMESTAMP" and isinstance(value, datetime):
        return timestamp_text(name, value)
    if kind.kind in _SCALE and isinstance(value, Decimal | int) and not isinstance(value, bool):
        exponent = Decimal(value).as_tuple().exponent
        if not isinstance(exponent, int) or -exponent > _SCALE[kind.kind]:
            raise ValueError(f"column {name}: {value!r} has more than {_SCALE[kind.kind]} decimal places ({kind})")
        return format(Decimal(value), "f")
    if kind.kind == "INT64" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind.kind == "FLOAT64" and isinstance(value, float | int) and not isinstance(value, bool):
        return float(value)
    if (kind.kind, type(value)) in (("BOOL", bool), ("STRING", str), ("DATE", date)):
        return value.isoformat() if isinstance(value, date) else value
    if kind.kind == "DATETIME" and isinstance(value, datetime) and value.tzinfo is None:
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")
    raise ValueError(f"column {name}: {type(value).__name__} value {value!r} does not fit BigQuery type {kind}")


def timestamp_text(name: str, value: datetime) -> str:
    """A TIMESTAMP as RFC 3339 in UTC with microseconds; `ValueError` for a naive datetime."""
    if value.tzinfo is None:
        raise ValueError(f"column {name}: TIMESTAMP values must be timezone-aware, got {value!r}")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _variant(name: str, value: Any) -> RawJson:
    """A VARIANT's value, given as its JSON text (what `onceflow.jobs.publish.sinks.pane_rows` reads it as), copied as it is."""
    try:
        if isinstance(value, str):
            json.loads(value)
            return RawJson(value)
    except ValueError:
        pass
    raise ValueError(f"column {name}: {type(value).__name__} value {value!r} is not the JSON text of a VARIANT")


def json_text(value: Any) -> str:
    """`value` (as `json_value` returns it) as compact JSON, `RawJson` pieces copied in."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json_text(str(k))}:{json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(json_text, value)) + "]"
    return json.dumps(value, ensure_ascii=False)
