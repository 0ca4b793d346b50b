"""The table features a Delta table needs beyond what delta-rs lists when it creates one."""

from __future__ import annotations

from deltalake import DeltaTable
from deltalake.table import TableFeatures
from pyspark.sql import types as T

from onceflow.resources.delta_storage import delta_table


def complete_protocol(table: DeltaTable, schema: T.StructType) -> None:
    """Add the `invariants` writer feature to a table with table features (delta-rs lists `timestampNtz`,
    `variantType` for such columns) and a NOT NULL field: Delta's own writer refuses the table without it, and
    delta-rs does not list it. Also run where the table exists: a crash or a racing creator may not have got to it.
    """
    features = table.protocol().writer_features
    if features is None or "invariants" in features or not _has_not_null(schema):
        return
    try:
        table.alter.add_feature(TableFeatures.Invariants)
    except Exception:
        if "invariants" not in (delta_table(table.table_uri).protocol().writer_features or ()):
            raise  # not a racing writer having added it first


def _has_not_null(schema: T.StructType) -> bool:
    return any(not f.nullable or (isinstance(f.dataType, T.StructType) and _has_not_null(f.dataType))
               for f in schema.fields)
