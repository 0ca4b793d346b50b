"""Which filter bucket each row of a table falls in (`onceflow.jobs.dedup.id_filters`). A bucket is the unit the
filters are saved, caught up and rebuilt in: the rows a batch adds should join few buckets, and a bucket no batch
adds to any more is never written again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Bucketing:
    """A raw table's bucket is its partition, `time_bucket` (`partition`). A dead-letter table has no partitions
    (a bad record may have no event time): there, a row's bucket is its `batch_id` // `batches`, so a batch's rows
    join the newest bucket and a bucket of older batches stays as saved (one bucket for the whole table would be
    rewritten whole as it grew)."""

    partition: str | None = None
    batches: int = 4096

    @property
    def columns(self) -> list[str]:
        """The columns to read with `record_id` to place a row."""
        return [] if self.partition else ["batch_id"]

    def of(self, rows: pa.Table | pa.RecordBatch, partition_values: Mapping[str, Any]) -> np.ndarray:
        """The bucket of each of `rows` (read with `columns`), from a file whose partition values are given."""
        if self.partition:
            return np.full(rows.num_rows, int(partition_values[self.partition]), dtype=np.int64)
        batches = pc.fill_null(rows.column("batch_id"), -1).to_numpy(zero_copy_only=False)
        return batches.astype(np.int64) // self.batches

    def of_batch(self, batch_id: int, count: int) -> np.ndarray:
        """The bucket of `count` rows a batch writes (`Bucketing()` only: a raw row's bucket is its own)."""
        return np.full(count, batch_id // self.batches, dtype=np.int64)

    def removed_from(self, partition_values: Mapping[str, Any]) -> int | None:
        """The bucket a removed file's rows were in, None when the removal does not say (its filters are then
        rebuilt whole)."""
        value = partition_values.get(self.partition) if self.partition else None
        return None if value is None else int(value)


TIME_BUCKETS = Bucketing(partition="time_bucket")
BATCH_RANGES = Bucketing()
