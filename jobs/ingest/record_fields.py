"""How a record's JSON fields become typed columns (DESIGN section 6a), as SQL text for `onceflow.jobs.ingest.validation`.

Spark's JSON reader converts them: one `from_json` of the payload with the record schema, PERMISSIVE, so a value
that does not convert leaves the record's text in the corrupt-record column `_corrupt` instead of failing the
batch. onceflow is stricter where Spark keeps a value that is not the one sent: a TINYINT or SMALLINT that wraps
(Jackson reads 200 as the byte -56), a FLOAT or DOUBLE that is not finite, a DECIMAL with more places than declared
(Spark rounds), a DATE or TIMESTAMP outside the years 1..9999 (a JSON number for a TIMESTAMP is epoch seconds, as
Spark reads it: epoch milliseconds land there), a null in a NOT NULL field of a STRUCT (Spark ignores nested NOT
NULL). Those types are read one size wider, checked, then narrowed.

Which value failed and why (`wrong_type`, `out_of_range`, `missing_field`, with its path, `items[2].price`) is
worked out only for the records that failed, over them alone
(`onceflow.jobs.ingest.validation.explain_flagged`), from each value as a VARIANT, converted again on its own.
"""

from __future__ import annotations

import itertools

from pyspark.sql import types as T

from onceflow.jobs.declare.schema import INTEGRAL, quoted, type_ddl

OPTIONS = (
    "map('columnNameOfCorruptRecord', '_corrupt', 'allowNonNumericNumbers', 'false', 'allowSingleQuotes', 'false', "
    "'timeZone', 'UTC')"
)
"""Spark's JSON reader kept to JSON: no NaN or Infinity tokens, no single quotes; times without an offset are UTC."""
_INTEGER_KINDS = "('TINYINT', 'SMALLINT', 'INT', 'BIGINT')"
_BOUNDS = {
    T.ByteType: ("-128", "127"),
    T.ShortType: ("-32768", "32767"),
    # NaN is above every number (and so out of these bounds), in a comparison as in array_max
    T.FloatType: ("-3.4028234663852886E38", "3.4028234663852886E38"),
    T.DoubleType: ("-1.7976931348623157E308", "1.7976931348623157E308"),
    T.DateType: ("DATE'0001-01-01'", "DATE'9999-12-31'"),
    T.TimestampType: ("TIMESTAMP'0001-01-01 00:00:00Z'", "TIMESTAMP'9999-12-31 23:59:59.999999Z'"),
    T.TimestampNTZType: ("TIMESTAMP_NTZ'0001-01-01 00:00:00'", "TIMESTAMP_NTZ'9999-12-31 23:59:59.999999'"),
}


def wide(data_type: T.DataType) -> T.DataType:
    """The type `data_type` is read as, so that the stricter checks can see what Spark would wrap or round."""
    if isinstance(data_type, T.ByteType | T.ShortType):
        return T.IntegerType()
    if isinstance(data_type, T.FloatType):
        return T.DoubleType()
    if isinstance(data_type, T.DecimalType):
        # The declared integer digits, and as many places as fit: rounding to the declared scale is then visible.
        return T.DecimalType(38, 38 - (data_type.precision - data_type.scale))
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(wide(data_type.elementType))
    if isinstance(data_type, T.MapType):
        return T.MapType(T.StringType(), wide(data_type.valueType))
    if isinstance(data_type, T.StructType):
        return T.StructType([T.StructField(f.name, wide(f.dataType)) for f in data_type.fields])
    return data_type


def narrowed(data_type: T.DataType, value: str) -> str:
    """SQL: `value` (read as `wide(data_type)`) as `data_type`."""
    return value if wide(data_type) == data_type else f"try_cast({value} AS {type_ddl(data_type)})"


def strict(data_type: T.DataType, value: str, names: itertools.count | None = None) -> str | None:
    """SQL: whether `value` (read as `wide(data_type)`) keeps onceflow's stricter rules; None: nothing to check."""
    check = _check(data_type, value, names or itertools.count())
    return None if check is None else f"({value} IS NULL OR coalesce({check}, false))"


def _check(data_type: T.DataType, value: str, names: itertools.count) -> str | None:
    bounds = _BOUNDS.get(type(data_type))
    if bounds:
        return f"{value} BETWEEN {bounds[0]} AND {bounds[1]}"
    if isinstance(data_type, T.DecimalType):
        return f"try_cast({value} AS {type_ddl(data_type)}) = {value}"
    if isinstance(data_type, T.ArrayType):
        return _every(data_type.elementType, value, names)
    if isinstance(data_type, T.MapType):
        return _every(data_type.valueType, f"map_values({value})", names)
    if isinstance(data_type, T.StructType):
        parts = []
        for f in data_type.fields:
            child = f"{value}.{quoted(f.name)}"
            if not f.nullable:
                parts.append(f"{child} IS NOT NULL")
            inner = strict(f.dataType, child, names)
            if inner is not None:
                parts.append(inner)
        return " AND ".join(f"({part})" for part in parts) or None
    return None


def _every(data_type: T.DataType, values: str, names: itertools.count) -> str | None:
    """SQL: whether every element of the array `values` (of `wide(data_type)`) keeps the stricter rules, NULL when it
    is NULL; None: nothing to check. Written without a lambda where there is a way (bounds by `array_min` and
    `array_max`, a decimal by the array cast): a lambda (`forall`) keeps Spark from compiling the projection that
    holds it into its stage, so each record costs a copy of its row and an interpreted step."""
    bounds = _BOUNDS.get(type(data_type))
    if bounds:
        return f"coalesce(array_min({values}) >= {bounds[0]} AND array_max({values}) <= {bounds[1]}, true)"
    if isinstance(data_type, T.DecimalType):
        rounded = f"try_cast({values} AS ARRAY<{type_ddl(data_type)}>)"
        return f"cast({rounded} AS ARRAY<{type_ddl(wide(data_type))}>) = {values}"
    if isinstance(data_type, T.StructType) and all(f.nullable for f in data_type.fields):
        # `values.f` is the array of each element's field `f`, NULL for a NULL element
        parts = [_every(f.dataType, f"{values}.{quoted(f.name)}", names) for f in data_type.fields]
        return " AND ".join(f"({part})" for part in parts if part) or None
    element = f"_s{next(names)}"
    inner = strict(data_type, element, names)
    return None if inner is None else f"forall({values}, {element} -> {inner})"


def not_an_object() -> str:
    """SQL: `named_struct(reason, detail)` when `payload` is not a JSON object (`not_json`: not JSON, or JSON of
    another kind), else NULL."""
    shape = f"from_json(payload, '_corrupt STRING', {OPTIONS})"
    return (
        f"CASE WHEN {shape} IS NULL OR {shape}._corrupt IS NOT NULL THEN named_struct('reason', 'not_json', 'detail', "
        "coalesce('payload is JSON ' || schema_of_variant(try_parse_json(payload)) || ', not an object', "
        "'payload is not JSON')) END"
    )


def failure(schema: T.StructType) -> str:
    """SQL: `named_struct(reason, detail)` of a flagged record whose payload is a JSON object (see `not_an_object`):
    its first value (in schema order) that is missing, of the wrong type or out of range."""
    names = itertools.count()
    fields = [
        _field(f, f"from_json(payload, '{quoted(f.name)} VARIANT', {OPTIONS}).{quoted(f.name)}", f"'{f.name}'", names)
        for f in schema.fields
    ]
    # Unreachable unless Spark refuses a value that the per-value conversion accepts: never a valid record then.
    unknown = "named_struct('reason', 'wrong_type', 'detail', 'a value Spark''s JSON reader does not convert')"
    return f"coalesce({', '.join([*(part for part in fields if part), unknown])})"


def _let(value: str, name: str, body: str) -> str:
    """SQL: `body` with `name` bound to `value`, evaluated once."""
    return f"element_at(transform(array({value}), {name} -> {body}), 1)"


def _field(f: T.StructField, value: str, path: str, names: itertools.count) -> str | None:
    """SQL: the first failure of the JSON value `value` (a VARIANT, NULL when absent) of field `f` at `path`."""
    name = f"_v{next(names)}"
    declared = f.dataType.simpleString().upper()
    parts = []
    if not f.nullable:
        parts.append(
            f"CASE WHEN {name} IS NULL OR is_variant_null({name}) THEN named_struct('reason', 'missing_field', "
            f"'detail', format_string('`%s` is missing or null; it is {declared} NOT NULL', {path})) END"
        )
    node = _node(f.dataType, name, path, names)
    if node is not None:
        parts.append(node)
    if not parts:
        return None
    return _let(value, name, parts[0] if len(parts) == 1 else f"coalesce({', '.join(parts)})")


def _verdict(reason: str, data_type: T.DataType, value: str, path: str) -> str:
    """SQL: the dead-letter verdict `reason` (`wrong_type` or `out_of_range`) for `value` at `path`, naming what was
    found."""
    declared = data_type.simpleString().upper()
    said = "not" if reason == "wrong_type" else "which does not fit"
    return (
        f"named_struct('reason', '{reason}', 'detail', format_string('`%s` is %s %s, {said} {declared}', {path}, "
        f"schema_of_variant({value}), substring(to_json({value}), 1, 60)))"
    )


def _node(data_type: T.DataType, value: str, path: str, names: itertools.count) -> str | None:
    """SQL: the first failure inside the JSON value `value` (a VARIANT) read as `data_type`; None: it cannot fail."""
    if isinstance(data_type, T.StringType | T.VariantType):
        return None  # Spark's rule: a STRING takes any JSON value (a number's or an object's text)
    kind = f"schema_of_variant({value})"
    present = f"{value} IS NOT NULL AND NOT is_variant_null({value})"
    wrong = _verdict("wrong_type", data_type, value, path)
    if isinstance(data_type, T.StructType):
        children = [
            _field(f, f"try_variant_get({value}, '$[\"{f.name}\"]', 'variant')", f"{path} || '.{f.name}'", names)
            for f in data_type.fields
        ]
        inside = f"coalesce({', '.join(c for c in children if c)})" if any(children) else "NULL"
        return f"CASE WHEN NOT ({present}) THEN NULL WHEN NOT startswith({kind}, 'OBJECT') THEN {wrong} ELSE {inside} END"
    if isinstance(data_type, T.ArrayType | T.MapType):
        shape = "ARRAY" if isinstance(data_type, T.ArrayType) else "OBJECT"
        element, index = f"_e{next(names)}", f"_i{next(names)}"
        if isinstance(data_type, T.ArrayType):
            items = f"try_variant_get({value}, '$', 'array<variant>')"
            inner = _node(data_type.elementType, element, f"{path} || '[' || {index} || ']'", names)
        else:
            items = f"map_values(try_variant_get({value}, '$', 'map<string, variant>'))"
            keys = f"map_keys(try_variant_get({value}, '$', 'map<string, variant>'))"
            inner = _node(data_type.valueType, element, f"{path} || '[\"' || {keys}[{index}] || '\"]'", names)
        first = "NULL" if inner is None else (
            f"try_element_at(filter(transform({items}, ({element}, {index}) -> {inner}), {element} -> "
            f"{element} IS NOT NULL), 1)"
        )
        return f"CASE WHEN NOT ({present}) THEN NULL WHEN NOT startswith({kind}, '{shape}') THEN {wrong} ELSE {first} END"
    converted = f"_c{next(names)}"
    wide_type = wide(data_type)
    text = f"concat('{{\"x\": ', to_json({value}), '}}')"
    failed = f"{converted}._corrupt IS NOT NULL"
    if isinstance(data_type, INTEGRAL):
        # Spark takes only an integer token (5, not 5.0): as a VARIANT an integer token is one of these kinds.
        failed = f"({failed} OR {kind} NOT IN {_INTEGER_KINDS})"
    numeric = f"{kind} RLIKE '^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL.*)$'"
    if isinstance(data_type, INTEGRAL):
        fits = f"({kind} IN {_INTEGER_KINDS} OR {kind} RLIKE '^DECIMAL\\\\((19|[2-9][0-9]),0\\\\)$')"
    elif isinstance(data_type, T.DecimalType):
        fits = f"({numeric} OR try_cast(try_variant_get({value}, '$', 'string') AS DOUBLE) IS NOT NULL)"
    elif isinstance(data_type, T.FloatType | T.DoubleType):
        fits = numeric
    else:
        fits = "false"  # a BOOLEAN, or a date or time that does not parse
    # A value the reader did not convert that is of a kind that fits, or one it converted that a rule refuses.
    out_of_range = f"CASE WHEN {failed} THEN {fits} ELSE NOT {strict(data_type, f'{converted}.x') or 'true'} END"
    body = (
        f"CASE WHEN NOT ({present}) THEN NULL "
        f"WHEN {out_of_range} THEN {_verdict('out_of_range', data_type, value, path)} "
        f"WHEN {failed} THEN {_verdict('wrong_type', data_type, value, path)} END"
    )
    return _let(f"from_json({text}, 'x {type_ddl(wide_type)}, _corrupt STRING', {OPTIONS})", converted, body)
