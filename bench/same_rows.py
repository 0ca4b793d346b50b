"""Every contender must end with the same valid rows (issue 26): a throughput figure of a table that holds other
values would compare different work.

The reference is onceflow exactly-once's raw table (record ID -> event time and typed fields) and, for the records
it dead-lettered, their reasons. Any other table is compared over the IDs the reference holds: every row with such
an ID (each copy, for a contender that keeps duplicates) must hold the reference's values. Rows with another ID are
counted: by onceflow's dead-letter reason when onceflow dead-lettered that ID (the peer keeps a malformed line as a
row with NULLs where a value did not convert, or rounds a decimal onceflow refuses), else as `other_rows` (no ID,
or one onceflow never saw as an ID: a line too truncated to read it from is a dead letter under its position).
Read with delta-rs, a second engine, and not timed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from bench.datasets import BenchmarkError, Dataset, Source

SHOWN = 10  # mismatched IDs named in a report
KEEPS_DUPLICATES = ("at_least_once", "floor")


@dataclass(frozen=True)
class Reference:
    """onceflow exactly-once's valid rows (ID, event time, the record's fields) and why it refused the others."""

    rows: pa.Table
    reasons: dict[str, str]

    @classmethod
    def of_onceflow(cls, raw_path: str, dead_letter_path: str, dataset: Dataset) -> Reference:
        rows = _columns(raw_path, "record_id", "event_time", dataset)
        dead = DeltaTable(dead_letter_path).to_pyarrow_table(columns=["record_id", "reason"])
        return cls(rows, dict(zip(dead.column("record_id").to_pylist(), dead.column("reason").to_pylist(), strict=True)))


@dataclass
class Comparison:
    rows: int
    valid_rows: int  # rows with an ID the reference holds
    valid_ids: int  # distinct IDs among them
    missing_ids: int  # IDs the reference holds that the table lacks
    mismatches: int  # rows with a reference ID whose values differ from the reference's
    mismatched: dict[str, list[str]] = field(default_factory=dict)  # column -> the first IDs that differ in it
    kept_dead_letters: dict[str, int] = field(default_factory=dict)  # by onceflow's reason
    other_rows: int = 0


def _columns(path: str, id_column: str, time_column: str, dataset: Dataset) -> pa.Table:
    return DeltaTable(path).to_pyarrow_table(columns=[id_column, time_column, *dataset.fields]).sort_by(id_column)


def compare(reference: Reference, path: str, id_column: str, time_column: str, dataset: Dataset) -> Comparison:
    """The table at `path` (its ID in `id_column`, its event time in `time_column`) against `reference`."""
    table = _columns(path, id_column, time_column, dataset)
    expected_ids = reference.rows.column(0)
    index = pc.index_in(table.column(0), value_set=expected_ids)
    known = pc.is_valid(index)
    valid = table.filter(known)
    expected = reference.rows.take(index.filter(known))
    differ: set[int] = set()
    mismatched: dict[str, list[str]] = {}
    for name, got, want in zip(table.column_names[1:], valid.columns[1:], expected.columns[1:], strict=True):
        got = got if got.type == want.type else got.cast(want.type)
        if got.equals(want):
            continue
        rows = [i for i, (a, b) in enumerate(zip(got.to_pylist(), want.to_pylist(), strict=True)) if a != b]
        differ.update(rows)
        mismatched[name] = [valid.column(0)[i].as_py() for i in rows[:SHOWN]]
    distinct = pc.count_distinct(valid.column(0)).as_py()
    others = Counter(reference.reasons.get(i, "") for i in table.column(0).filter(pc.invert(known)).to_pylist())
    other_rows = others.pop("", 0)
    return Comparison(len(table), len(valid), distinct, len(expected_ids) - distinct, len(differ), mismatched,
                      dict(sorted(others.items())), other_rows)


def check(comparison: Comparison, contender: str, round_no: int, source: Source, deduplicates: bool) -> None:
    """Fail unless the table holds every valid record with the reference's values: once each (`deduplicates`),
    else as often as the files hold it."""
    valid_lines = source.records - source.malformed
    problems = []
    if comparison.mismatches:
        problems.append(f"{comparison.mismatches} rows differ from onceflow exactly-once's; by column, the first IDs: "
                        f"{comparison.mismatched}")
    if comparison.missing_ids:
        problems.append(f"{comparison.missing_ids} valid record IDs are missing")
    expected = source.events if deduplicates else valid_lines
    if comparison.valid_rows != expected:
        problems.append(f"{comparison.valid_rows} rows of valid records, expected {expected}")
    if problems:
        raise BenchmarkError(f"{contender} round {round_no} ({source.dataset.name}): " + "; ".join(problems))


class Judge:
    """Compares every contender's table of one data set to the reference, once it exists: it is taken from the first
    run of onceflow exactly-once (the warm-up; without that contender nothing is compared)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.reference: Reference | None = None

    def onceflow(self, contender: str, round_no: int, raw_path: str, dead_letter_path: str) -> dict[str, Any] | None:
        if self.reference is None and contender == "exactly_once":
            self.reference = Reference.of_onceflow(raw_path, dead_letter_path, self.source.dataset)
        return self._compare(contender, round_no, raw_path, "record_id", "event_time")

    def peer(self, contender: str, round_no: int, table: str) -> dict[str, Any] | None:
        dataset = self.source.dataset
        return self._compare(contender, round_no, table, dataset.id_field, dataset.time_field)

    def _compare(self, contender: str, round_no: int, path: str, id_column: str, time_column: str
                 ) -> dict[str, Any] | None:
        if self.reference is None:
            return None
        comparison = compare(self.reference, path, id_column, time_column, self.source.dataset)
        check(comparison, contender, round_no, self.source, deduplicates=contender not in KEEPS_DUPLICATES)
        return asdict(comparison)
