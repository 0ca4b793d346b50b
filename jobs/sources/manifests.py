"""What each committed batch landed, kept beside its commit: its records' IDs and event times, in landing order.

`onceflow verify` checks the tables against every batch's input read again from its source, in plain Python and
apart from Spark's reading of it. Sources do not keep their input for ever: a Kafka topic's retention or compaction
removes offsets, a file source's processed files are archived, landing files are cleaned up. A batch's manifest,
written while the batch commits, keeps what that check needs without the source: one Parquet file per batch,
`<home>/manifests/<app id>/<batch>.parquet`, with each landed record's ID and event time as ingest classified them.
"""

from __future__ import annotations

import io

import pyarrow as pa
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
