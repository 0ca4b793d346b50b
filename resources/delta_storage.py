"""delta-rs's view of a Delta table at a local path or a `gs://` URI: the one place that gives it the storage
options its scheme needs (`onceflow.resources.gcs`); and pyarrow's, for reading the table's files directly."""

from __future__ import annotations

from urllib.parse import urlsplit

import pyarrow.fs as pafs
from deltalake import DeltaTable

from onceflow.resources.gcs import delta_rs_gcs_options, is_gcs
from onceflow.resources.settings import load_settings


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs's storage options for the table at `uri` (None for a local path)."""
    return delta_rs_gcs_options(load_settings().storage_emulator_host) if is_gcs(uri) else None


def delta_table(uri: str, version: int | None = None) -> DeltaTable:
    """The table at `uri` (at `version`, else its latest) as delta-rs reads it."""
    return DeltaTable(uri, version=version, storage_options=storage_options(uri))


def table_files(uri: str) -> tuple[pafs.FileSystem, str]:
    """A file system holding the files of the table at `uri`, and the table's root in it: to read the Delta log's
    commit files and data files directly (`onceflow.jobs.dedup.log_ids`), on local disk or GCS alike."""
    uri = uri.rstrip("/")
    if not is_gcs(uri):
        return pafs.LocalFileSystem(), uri.removeprefix("file://")
    host = load_settings().storage_emulator_host
    if host is None:
        return pafs.GcsFileSystem(), uri.removeprefix("gs://")  # Application Default Credentials
    emulator = urlsplit(host)
    files = pafs.GcsFileSystem(anonymous=True, scheme=emulator.scheme, endpoint_override=emulator.netloc)
    return files, uri.removeprefix("gs://")
