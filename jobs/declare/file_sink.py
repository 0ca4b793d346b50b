"""`FileSink`: files on a local path or `gs://`, for window panes (JSON lines) and for records (JSON lines or
Parquet).

A record publication is one object per commit, named by it alone, written whole (a rename on local disk, one
upload on GCS): readers see whole batches only, and writing a commit again writes the same name::

    <path>/<output>/epoch=<epoch>/batch=<batch, 12 digits>.<jsonl | parquet>
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from onceflow.jobs.declare.sink import Commit, Sink, record_json
from onceflow.resources.object_store import ObjectStore, open_store
from onceflow.resources.settings import load_settings

if TYPE_CHECKING:
    import pyarrow as pa

FileFormat = Literal["jsonl", "parquet"]
FILE_FORMATS: tuple[str, ...] = get_args(FileFormat)


@dataclass(frozen=True, kw_only=True)
class FileSink(Sink):
    """Files under `path` (default `<ONCEFLOW_HOME>/published`) in `format`: a window output's final panes as
    JSON lines (`onceflow.jobs.publish.pane_sequence`), a record output's batches as one object each."""

    path: str | None = None
    format: FileFormat = "jsonl"

    @property
    def name(self) -> str:
        return f"files:{self.path or 'published'}"

    @property
    def root(self) -> str:
        return self.path or f"{load_settings().home_path}/published"

    def key(self, commit: Commit) -> str:
        return f"{commit.output}/epoch={commit.epoch}/batch={commit.batch:012d}.{self.format}"

    def write(self, rows: pa.Table, commit: Commit) -> None:
        self._store().write(self.key(commit), self.encode(rows))

    def committed(self, commit: Commit) -> bool:
        return self._store().exists(self.key(commit))

    def rows(self, commit: Commit) -> int | None:
        data = self._store().read(self.key(commit))
        if data is None:
            return None
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
        return data.count(b"\n")

    def encode(self, rows: pa.Table) -> bytes:
        """The object's bytes: a pure function of the rows (written again, the same bytes)."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            buffer = io.BytesIO()
            pq.write_table(rows, buffer)
            return buffer.getvalue()
        return "".join(record_json(row) + "\n" for row in rows.to_pylist()).encode()

    def problems(self) -> list[str]:
        if self.format not in FILE_FORMATS:
            return [f"format {self.format!r}: use {' or '.join(map(repr, FILE_FORMATS))}"]
        if self.path is not None and not isinstance(self.path, str):
            return [f"path {self.path!r} is not a path or gs:// URL"]
        return []

    def _store(self) -> ObjectStore:
        return open_store(self.root)
