"""Record schemas as pipelines declare them (a Spark DDL string), parsed without Spark.

`parse_schema` reads the DDL subset a JSON record can fill (`name TYPE [NOT NULL] [COMMENT '...']`, comma-
separated) into a pyspark `StructType`, so a declaration with an unknown type fails when the code location loads,
before any JVM starts. Types: STRING (VARCHAR(n), CHAR(n)), BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT,
DOUBLE, DECIMAL(p, s), DATE, TIMESTAMP, TIMESTAMP_NTZ, ARRAY<T>, MAP<STRING, T>, STRUCT<name: T, ...>, VARIANT.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pyspark.sql import types as T

_TOKEN = re.compile(r"\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*|[0-9]+|'(?:[^'\\]|\\.)*'|[(),<>:])")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIMPLE: dict[str, T.DataType] = {
    "STRING": T.StringType(),
    "BOOLEAN": T.BooleanType(),
    "BOOL": T.BooleanType(),
    "TINYINT": T.ByteType(),
    "BYTE": T.ByteType(),
    "SMALLINT": T.ShortType(),
    "SHORT": T.ShortType(),
    "INT": T.IntegerType(),
    "INTEGER": T.IntegerType(),
    "BIGINT": T.LongType(),
    "LONG": T.LongType(),
    "FLOAT": T.FloatType(),
    "REAL": T.FloatType(),
    "DOUBLE": T.DoubleType(),
    "DATE": T.DateType(),
    "TIMESTAMP": T.TimestampType(),
    "TIMESTAMP_LTZ": T.TimestampType(),
    "TIMESTAMP_NTZ": T.TimestampNTZType(),
    "VARIANT": T.VariantType(),
}
INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


class SchemaError(ValueError):
    """A schema string that is not a record schema onceflow can validate records against."""


def parse_schema(ddl: str | T.StructType) -> T.StructType:
    """Parse `"customer STRING NOT NULL, amount DECIMAL(18,2) NOT NULL, note STRING"` into a `StructType`."""
    if isinstance(ddl, T.StructType) and ddl.fields:
        ddl = schema_ddl(ddl)
    if isinstance(ddl, T.StructField | T.DataType):
        raise SchemaError(f"{ddl!r} is not a record schema: give a StructType of at least one field, or DDL such as "
                          "\"key STRING NOT NULL\"")
    if not isinstance(ddl, str):
        raise SchemaError(f"{type(ddl).__name__} is not a schema: give Spark DDL (\"key STRING NOT NULL, n BIGINT\") "
                          "or a StructType")
    if not ddl.strip():
        raise SchemaError("the schema is empty: declare at least one field, e.g. \"key STRING NOT NULL\"")
    tokens = _tokens(ddl)
    parser = _Parser(tokens, ddl)
    fields = [parser.field(top_level=True)]
    while parser.accept(","):
        fields.append(parser.field(top_level=True))
    parser.end()
    _distinct(fields, "")
    return T.StructType(fields)


def schema_ddl(schema: T.StructType) -> str:
    """A `StructType` as the DDL `parse_schema` reads (`"customer STRING NOT NULL, amount DECIMAL(18,2)"`)."""
    return ", ".join(f"{_name(f.name)} {_declared(f.dataType)}{'' if f.nullable else ' NOT NULL'}"
                     for f in schema.fields)


def _name(name: str) -> str:
    # Quoted only when it must be, so that the parser names a field it refuses as it was spelled.
    return name if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) else quoted(name)


def _declared(data_type: T.DataType) -> str:
    if isinstance(data_type, T.StructType):
        fields = (f"{_name(f.name)}: {_declared(f.dataType)}{'' if f.nullable else ' NOT NULL'}"
                  for f in data_type.fields)
        return f"STRUCT<{', '.join(fields)}>"
    if isinstance(data_type, T.ArrayType):
        return f"ARRAY<{_declared(data_type.elementType)}>"
    if isinstance(data_type, T.MapType):
        return f"MAP<{_declared(data_type.keyType)}, {_declared(data_type.valueType)}>"
    return data_type.simpleString().upper()


def _distinct(fields: list[T.StructField], where: str) -> None:
    """Refuse two fields whose names differ at most in case: Spark and Delta match column names without case."""
    seen: dict[str, str] = {}
    for f in fields:
        other = seen.get(f.name.lower())
        if other is None:
            seen[f.name.lower()] = f.name
        elif other == f.name:
            raise SchemaError(f"field {f.name!r}{where} is declared twice")
        else:
            raise SchemaError(
                f"fields {other!r} and {f.name!r}{where} differ only in case, and Spark and Delta match column names "
                "without case: declare one (a JSON key not declared stays in `payload`)"
            )


def _tokens(ddl: str) -> list[str]:
    tokens, position = [], 0
    while position < len(ddl):
        match = _TOKEN.match(ddl, position)
        if match is None:
            if not ddl[position:].strip():
                break
            raise SchemaError(f"unexpected {ddl[position:position + 20]!r} at character {position + 1}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens, self.text, self.i = tokens, text, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, what: str) -> str:
        token = self.peek()
        if token is None:
            raise SchemaError(f"the schema ends where {what} was expected")
        self.i += 1
        return token

    def accept(self, token: str) -> bool:
        if (self.peek() or "").upper() == token:
            self.i += 1
            return True
        return False

    def expect(self, token: str, after: str) -> None:
        if not self.accept(token):
            raise SchemaError(f"expected {token!r} after {after}, found {self.peek()!r}")

    def end(self) -> None:
        if self.peek() is not None:
            raise SchemaError(f"unexpected {self.peek()!r}: fields are separated by commas")

    def field(self, top_level: bool) -> T.StructField:
        name = self.take("a field name").strip("`")
        if not _NAME.match(name):
            raise SchemaError(f"field name {name!r}: use letters, digits and '_' (not starting with a digit); a JSON "
                              "key spelled otherwise is not a column, it stays in `payload`")
        if not top_level:
            self.accept(":")
        data_type = self.type(f"field {name!r}")
        nullable = True
        if self.accept("NOT"):
            self.expect("NULL", f"NOT in field {name!r}")
            nullable = False
        if self.accept("COMMENT"):
            self.take("a comment")
        return T.StructField(name, data_type, nullable)

    def type(self, where: str) -> T.DataType:
        word = self.take(f"the type of {where}")
        upper = word.upper()
        if upper in ("VARCHAR", "CHAR"):
            self.expect("(", upper)
            self.number(upper)
            self.expect(")", upper)
            return T.StringType()
        if upper in ("DECIMAL", "DEC", "NUMERIC"):
            precision, scale = 10, 0
            if self.accept("("):
                precision = self.number(upper)
                if self.accept(","):
                    scale = self.number(upper)
                self.expect(")", f"{upper}({precision}")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise SchemaError(f"{where}: DECIMAL({precision}, {scale}) needs 1 <= precision <= 38, scale <= precision")
            return T.DecimalType(precision, scale)
        if upper == "ARRAY":
            self.expect("<", "ARRAY")
            element = self.type(f"the elements of {where}")
            self.expect(">", "the ARRAY element type")
            return T.ArrayType(element)
        if upper == "MAP":
            self.expect("<", "MAP")
            key = self.type(f"the keys of {where}")
            if not isinstance(key, T.StringType):
                raise SchemaError(f"{where}: MAP keys must be STRING (JSON object keys are strings)")
            self.expect(",", "the MAP key type")
            value = self.type(f"the values of {where}")
            self.expect(">", "the MAP value type")
            return T.MapType(key, value)
        if upper == "STRUCT":
            self.expect("<", "STRUCT")
            fields = [self.field(top_level=False)]
            while self.accept(","):
                fields.append(self.field(top_level=False))
            self.expect(">", "the STRUCT fields")
            _distinct(fields, f" of {where}")
            return T.StructType(fields)
        if upper in _SIMPLE:
            return _SIMPLE[upper]
        if upper == "BINARY":
            raise SchemaError(f"{where}: BINARY cannot come from JSON (it has no bytes type); declare STRING")
        raise SchemaError(f"{where}: unknown type {word!r}")

    def number(self, where: str) -> int:
        token = self.take(f"a number in {where}")
        if not token.isdigit():
            raise SchemaError(f"expected a number in {where}, found {token!r}")
        return int(token)


def type_ddl(data_type: T.DataType, *, for_reader: bool = True) -> str:
    """`data_type` as Spark DDL. For a reader (`from_json`, a cast) field names are back-quoted and nullability is
    left out (the JSON reader ignores it); for a message, names are plain and NOT NULL is kept."""
    if isinstance(data_type, T.StructType):
        fields = (f"{quoted(f.name) if for_reader else f.name}: {type_ddl(f.dataType, for_reader=for_reader)}"
                  + ("" if for_reader or f.nullable else " NOT NULL") for f in data_type.fields)
        return f"STRUCT<{', '.join(fields)}>"
    if isinstance(data_type, T.ArrayType):
        return f"ARRAY<{type_ddl(data_type.elementType, for_reader=for_reader)}>"
    if isinstance(data_type, T.MapType):
        key, value = (type_ddl(t, for_reader=for_reader) for t in (data_type.keyType, data_type.valueType))
        return f"MAP<{key}, {value}>"
    return data_type.simpleString().upper()


def has_variant(data_type: T.DataType) -> bool:
    """Whether `data_type` is or holds (at any depth) a VARIANT."""
    if isinstance(data_type, T.ArrayType):
        return has_variant(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return has_variant(data_type.valueType)
    if isinstance(data_type, T.StructType):
        return any(has_variant(f.dataType) for f in data_type.fields)
    return isinstance(data_type, T.VariantType)


def quoted(name: str) -> str:
    """`name` as a SQL identifier, however it is spelled (a field name may hold dots or spaces, never "`")."""
    return f"`{name}`"


def sql_string(text: str) -> str:
    """`text` as a SQL string literal, whatever characters it holds (its UTF-8 bytes, in hex)."""
    return f"CAST(X'{text.encode().hex()}' AS STRING)"


def sql_strings(texts: Iterable[str]) -> str:
    """`texts` as a SQL array literal of strings (see `sql_string`)."""
    return f"array({', '.join(map(sql_string, texts))})"
