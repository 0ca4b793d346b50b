"""What a source's committed batches landed, as reconciliation reads it, and how each batch could be read.

A batch is read again from its source in plain Python (`onceflow.jobs.sources.landed_ids`), apart from Spark's
reading of it: that reading is the independent fact the tables are checked against. A source that no longer holds a
batch's input as it was landed (its reader raises `InputGone`, or it now holds fewer records than the tables hold
of the batch, or than the batch's manifest says it landed: a Kafka topic compacted) cannot serve: the batch is then
read from its manifest (`onceflow.jobs.sources.manifests`), what ingest kept of it at commit time. A batch with
neither (committed before manifests were kept) is not re-checkable: it is counted, and its records are taken as the
tables hold them, so that later batches' duplicates of them still count as duplicates and every window balances.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.sources.landed_ids import LANDED, identify_all
from onceflow.jobs.sources.landing import InputGone
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.jobs.verify.tables import epoch_ms_columns
from onceflow.resources.files import FileChangedError


@dataclass
class LandedAccount:
    """Every landed record (`records`, `LANDED`), and the batches not read from their source: `from_manifest`
    (by batch: why their input could not serve) and `not_recheckable` (by batch: why)."""

    records: pa.Table
    from_manifest: dict[int, str] = field(default_factory=dict)
    not_recheckable: dict[int, str] = field(default_factory=dict)

    def summary(self) -> list[str]:
        """What the account says of the batches it did not read from their source, in a line each."""
        lines = []
        for what, batches in (("checked from their ID manifests", self.from_manifest),
                              ("not re-checkable (counted as the tables hold them)", self.not_recheckable)):
            if batches:
                reasons = Counter(batches.values())
                lines.append(f"{len(batches)} batches {what}: " + "; ".join(
                    f"{reason} ({n})" for reason, n in reasons.most_common()) + f"; batches {_ranges(batches)}")
        return lines


def landed_records(*epochs: SourceRuntime) -> LandedAccount:
    """The landed account of the source over each of `epochs` (its runtimes, oldest first; their batch numbers
    follow each other). Never raises for a batch whose input is gone: see the module docstring."""
    current = RecordContract.of(epochs[-1].pipeline)
    gone: dict[int, tuple[SourceRuntime, str]] = {}

    def readable() -> Iterator[tuple[int, list, RecordContract]]:
        for source in epochs:
            for batch in range(source.checkpoints.first_batch, source.checkpoints.load().committed_batch + 1):
                plan = source.plans.plan_of(batch)
                if plan is None:
                    gone[batch] = (source, "no plan in the checkpoints or the tables' commits")
                    continue
                contract = current if plan.contract is None else RecordContract.from_dict(plan.contract)
                try:
                    yield batch, source.reader.landed_rows(plan), contract
                except (InputGone, FileChangedError, FileNotFoundError) as error:
                    gone[batch] = (source, f"input gone: {type(error).__name__}")

    read = identify_all(readable())
    held = _held(epochs[-1])
    counts = _per_batch(read["batch_id"])
    for batch, rows in _per_batch(held["batch_id"]).items():
        if batch in counts and rows > counts[batch]:  # the source now holds fewer records than the batch landed
            gone[batch] = (_runtime_of(epochs, batch), "the source holds fewer records than the batch landed")
    account = LandedAccount(read)
    for batch, (source, reason) in sorted(gone.items()):
        manifest = source.manifests.read(batch)
        if manifest is not None:
            account.from_manifest[batch] = reason
        else:
            account.not_recheckable[batch] = reason
    # A batch read from its source whose manifest says it landed other records: its source changed (compacted).
    for batch in sorted(set(counts) - set(gone)):
        manifest = _runtime_of(epochs, batch).manifests.read(batch)
        if manifest is not None and manifest.num_rows != counts[batch]:
            account.from_manifest[batch] = "the source holds other records than the batch landed"
    account.records = _replaced(epochs, read, held, account)
    return account


def _replaced(
    epochs: tuple[SourceRuntime, ...], read: pa.Table, held: pa.Table, account: LandedAccount
) -> pa.Table:
    """`read` with the batches not read from their source taken from their manifests, or from the tables."""
    replaced = [*account.from_manifest, *account.not_recheckable]
    if not replaced:
        return read
    kept = read.filter(pc.invert(pc.is_in(read["batch_id"], value_set=pa.array(replaced, pa.int64()))))
    parts = [kept]
    for batch in account.from_manifest:
        manifest = _runtime_of(epochs, batch).manifests.read(batch)
        if manifest is not None:
            parts.append(pa.table({"batch_id": pa.array([batch] * manifest.num_rows, pa.int64()),
                                   "record_id": manifest["record_id"], "event_time_ms": manifest["event_time_ms"]},
                                  schema=LANDED))
    tables = held.filter(pc.is_in(held["batch_id"], value_set=pa.array(list(account.not_recheckable), pa.int64())))
    parts.append(tables.select(LANDED.names).cast(LANDED))
    return pa.concat_tables(parts).sort_by([("batch_id", "ascending")])


def _held(source: SourceRuntime) -> pa.Table:
    """The rows the raw and dead-letter tables hold: `batch_id`, `record_id`, `event_time_ms`."""
    columns = ["batch_id", "record_id", "event_time"]
    parts = [epoch_ms_columns(path, columns).rename_columns(LANDED.names)
             for path in (source.raw_path, source.dead_letter_path)]
    return pa.concat_tables([p.cast(LANDED) for p in parts])


def _per_batch(batches: pa.ChunkedArray) -> dict[int, int]:
    counts = pc.value_counts(batches.combine_chunks() if batches.num_chunks else pa.array([], pa.int64()))
    return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))


def _runtime_of(epochs: tuple[SourceRuntime, ...], batch: int) -> SourceRuntime:
    """The epoch's runtime whose batches include `batch`: the newest one starting at or before it."""
    return [s for s in epochs if s.checkpoints.first_batch <= batch][-1]


def _ranges(batches: dict[int, str]) -> str:
    """Batch numbers as ranges: `1-4, 7`."""
    out, numbers = [], sorted(batches)
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if n is not None:
            start = prev = n
    return ", ".join(out)
