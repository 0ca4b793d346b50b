"""What each committed batch landed, kept beside its commit: its records' IDs and event times, in landing order.

`onceflow verify` checks the tables against every batch's input read again from its source, in plain Python and
apart from Spark's reading of it. Sources do not keep their input for ever: a Kafka topic's retention or compaction
removes offsets, a file source's processed files are archived, landing files are cleaned up. A batch's manifest,
written while the batch commits, keeps what that check needs without the source: one Parquet file per batch,
`<home>/manifests/<app id>/<batch>.parquet`, with each landed record's ID and event time as ingest classified them.

Beside it, for a pipeline with an output that refires its windows, the minutes of event time the batch's valid
records fall in (`<batch>.minutes.json`, as runs `[first, last]` of epoch minutes): every window is a whole number of
minutes aligned to the epoch, so the window sensor tells from it which closed windows a batch brought late rows to,
for any output, without reading a row.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from onceflow.resources.object_store import ObjectStore

MANIFEST_SCHEMA = pa.schema([("record_id", pa.large_string()), ("event_time_ms", pa.int64())])


class ManifestStore:
    """The manifests of one source's batches (its `app_id`), in `store`."""

    def __init__(self, store: ObjectStore, app_id: str) -> None:
        self.store, self.app_id = store, app_id

    def _key(self, batch_id: int) -> str:
        return f"{self.app_id}/{batch_id:012d}.parquet"

    def write(self, batch_id: int, slim: pa.Table) -> None:
        """Keep batch `batch_id`'s records (`slim`: each one's `ordinal`, `record_id` and event time `t`) unless
        an earlier attempt kept them: a replay reads the same plan, so the same records."""
        ordered = slim.select(["ordinal", "record_id", "t"]).sort_by("ordinal")
        table = pa.table([ordered["record_id"].cast(pa.large_string()), ordered["t"].cast(pa.int64())],
                         schema=MANIFEST_SCHEMA)
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        self.store.create(self._key(batch_id), buffer.getvalue())

    def read(self, batch_id: int) -> pa.Table | None:
        """Batch `batch_id`'s manifest (`MANIFEST_SCHEMA`), None when it has none (committed before manifests were
        kept)."""
        data = self.store.read(self._key(batch_id))
        return None if data is None else pq.read_table(io.BytesIO(data)).cast(MANIFEST_SCHEMA)

    def write_minutes(self, batch_id: int, slim: pa.Table) -> None:
        """Keep the minutes of event time batch `batch_id`'s valid records (`slim`: `reason` NULL, time `t`) fall in."""
        times = pc.drop_null(slim["t"].filter(pc.is_null(slim["reason"]))).to_numpy(zero_copy_only=False)
        minutes = np.unique(np.floor_divide(times, 60_000))
        breaks = np.flatnonzero(np.diff(minutes) != 1) if len(minutes) else np.array([], np.int64)
        starts = np.concatenate(([0], breaks + 1)) if len(minutes) else breaks
        ends = np.concatenate((breaks, [len(minutes) - 1])) if len(minutes) else breaks
        runs = [[int(minutes[a]), int(minutes[b])] for a, b in zip(starts, ends, strict=True)]
        self.store.create(f"{self.app_id}/{batch_id:012d}.minutes.json", json.dumps(runs).encode())

    def minutes(self, batch_id: int) -> list[tuple[int, int]] | None:
        """Batch `batch_id`'s minutes of event time, as runs of epoch minutes; None when it has none kept."""
        data = self.store.read(f"{self.app_id}/{batch_id:012d}.minutes.json")
        return None if data is None else [(int(a), int(b)) for a, b in json.loads(data)]
