"""delta-rs's view of a Delta table at a local path or a `gs://` URI: the one place that gives it the storage
options its scheme needs (`onceflow.resources.gcs`); and pyarrow's, for reading the table's files directly."""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

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


def commit_actions(uri: str, version: int) -> list[dict[str, Any]]:
    """The actions of the table's commit `version`, read from its own file in the log (`FileNotFoundError`, an
    `OSError`, when it has none)."""
    files, root = table_files(uri)
    with files.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as entries:
        return [json.loads(line) for line in entries.read().splitlines() if line.strip()]


class _Held:
    """A table this thread read at its newest version, and the stamp of that version's commit file (its size and
    modification time, or its GCS generation): a table re-created or restored at the same path shows another."""

    def __init__(self, table: DeltaTable, stamp: tuple[int, int | None]) -> None:
        self.table, self.stamp = table, stamp


_held = threading.local()
_HELD_TABLES = 16
REREAD_VERSIONS = 10


def table_snapshot(uri: str, version: int | None = None) -> DeltaTable:
    """The table at `uri` at `version` (else its newest), as `delta_table` gives it, for reading only: a caller
    never writes through it (a write moves a delta-rs table to its own commit, under every other holder).

    A batch asks the same tables about their log a dozen times (its app id's batch, a commit's metadata, the
    newest version), and delta-rs reads the log anew each time a table is opened: several requests on object
    storage, and more as commits pile up between checkpoints. The table last read at its newest version is kept
    per thread (a thread's readers never share one with another thread) and given again while its commit file
    is unchanged and no later one exists: one look at the log (a listing from that commit on, on GCS) instead of
    a reading of it.
    """
    uri = _canonical(uri)
    tables: OrderedDict[str, _Held] = _held.__dict__.setdefault("tables", OrderedDict())
    held = tables.get(uri)
    if held is not None and version in (None, held.table.version()):
        stamp, newer = _log_from(uri, held.table.version())
        if stamp == held.stamp and not (version is None and newer):
            tables.move_to_end(uri)
            return held.table
    table = delta_table(uri, version)
    if version is None and (stamp := _log_from(uri, table.version())[0]) is not None:
        tables[uri] = _Held(table, stamp)
        tables.move_to_end(uri)
        while len(tables) > _HELD_TABLES:
            tables.popitem(last=False)
    return table


def writable_table(uri: str, version: int) -> DeltaTable:
    """The table at `uri` at `version`, for the caller to write through (a write moves it to its own commit).

    A batch writes each table on the version its decisions were made on, a commit or two past the one it last
    wrote: this thread's table of `uri` is moved forward through the commits since (`_moved`) instead of read
    anew, which lists the log and reads its last checkpoint."""
    return _moved("writable", uri, version)


class _Commit(NamedTuple):
    """A commit this process made: the table's version it made, that version's commit file stamp (`_log_from`),
    the table's Delta id, and the transaction `(app id, batch)` the commit carried."""

    version: int
    stamp: tuple[int, int | None]
    table_id: str
    app_id: str
    batch: int


_commits: dict[str, _Commit] = {}
_commits_lock = threading.Lock()


def made_commit(uri: str, version: int, table_id: str, app_id: str, batch: int) -> None:
    """Note that this process just made commit `version` of the table at `uri` (Delta id `table_id`), carrying the
    transaction `(app_id, batch)`.

    Until another commit follows it, the replay check and the filters read the table's newest version, its id and
    the app id's transaction from here, on any thread: following the commit with a table of their own would list
    the log (on local disk the whole `_delta_log`, a cost that grows with it), and a batch's
    dead letters commit on a thread of their own, which the next batch asks about on its main thread."""
    uri = _canonical(uri)
    stamp = _log_from(uri, version)[0]
    if stamp is not None:
        with _commits_lock:
            _commits[uri] = _Commit(version, stamp, table_id, app_id, batch)


def _last_commit(uri: str) -> _Commit | None:
    """This process's last commit to the table at `uri` (`made_commit`) while it is the newest, and its commit file
    the one that commit wrote (a table re-created or restored at the path shows another, or none)."""
    with _commits_lock:
        made = _commits.get(uri)
    return made if made is not None and _log_from(uri, made.version) == (made.stamp, False) else None


def transaction_version(uri: str, app_id: str) -> int | None:
    """The SetTransaction version the table at `uri` holds for `app_id` now (None if none), from its log."""
    uri = _canonical(uri)
    if (made := _last_commit(uri)) is not None and made.app_id == app_id:
        return made.batch
    return _moved("tracked", uri, None).transaction_version(app_id)


def newest_version(uri: str) -> int:
    """The table's newest version, from its log."""
    uri = _canonical(uri)
    made = _last_commit(uri)
    return made.version if made is not None else _moved("tracked", uri, None).version()


def table_head(uri: str) -> tuple[int, str]:
    """The table's newest version and its Delta table id, from one reading of its log."""
    uri = _canonical(uri)
    if (made := _last_commit(uri)) is not None:
        return made.version, made.table_id
    table = _moved("tracked", uri, None)
    return table.version(), table.metadata().id


def _moved(kind: str, uri: str, version: int | None) -> DeltaTable:
    """This thread's table of `uri` of this `kind` (tables to write through, or to read the log of here only: never
    one handed to a reader, which must not move under it), moved forward to `version` (None: the newest) through
    the commits since it was last at (`load_as_version`, `update_incremental`), else read anew.

    A table moved forward replays every commit since it was read, on each use, so it is read anew once
    `REREAD_VERSIONS` past that; and when `version` is older than it, or when the log no longer holds the commit
    file it was last at (the table re-created or restored at the same path)."""
    uri = _canonical(uri)
    tables: OrderedDict[str, tuple[DeltaTable, int, int, tuple]] = _held.__dict__.setdefault(kind, OrderedDict())
    kept, table = tables.pop(uri, None), None
    if kept is not None:
        held, read_at, at, stamp = kept
        now, newer = _log_from(uri, at)
        wanted = version if version is not None else held.version() + int(newer)  # at least
        if now == stamp and at <= held.version() <= wanted < read_at + REREAD_VERSIONS:
            try:
                if version is not None and held.version() < version:
                    held.load_as_version(version)
                elif version is None and newer:
                    held.update_incremental()
                table = held
            except DeltaError:  # the commits since are gone from the log (its retention): read anew
                table = None
    if table is None or (version is not None and table.version() != version):
        table, read_at = delta_table(uri, version), version
    if (stamp := _log_from(uri, table.version())[0]) is not None:
        tables[uri] = (table, table.version() if read_at is None else read_at, table.version(), stamp)
        while len(tables) > _HELD_TABLES:
            tables.popitem(last=False)
    return table


def _canonical(uri: str) -> str:
    """One name for a table however it is spelt: as onceflow's settings give it (`/lake/raw/events`), or as
    delta-rs gives it back (`DeltaTable.table_uri`: `file:///lake/raw/events/`). A table kept under one name is
    found under the other, and not followed through the log by a second table."""
    return uri.removeprefix("file://").rstrip("/")


def _log_from(uri: str, version: int) -> tuple[tuple[int, int | None] | None, bool]:
    """The stamp of commit `version`'s file in the table's log (None if there is none), and whether the log has a
    later commit."""
    if not is_gcs(uri):
        log = f"{uri.removeprefix('file://').rstrip('/')}/_delta_log"
        this, after = pafs.LocalFileSystem().get_file_info(
            [f"{log}/{version:020d}.json", f"{log}/{version + 1:020d}.json"]
        )
        stamp = (this.size, this.mtime_ns) if this.type == pafs.FileType.File else None
        return stamp, after.type != pafs.FileType.NotFound
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    log = f"{prefix.strip('/')}/_delta_log/" if prefix.strip("/") else "_delta_log/"
    first = f"{log}{version:020d}.json"
    # Names sort as versions: from this commit's file on come later versions' files (commits, checkpoints,
    # checksums), then `_last_checkpoint` and the like, whose names start after the digits.
    found = list(_storage_client().list_blobs(bucket, prefix=log, start_offset=first, max_results=2))
    stamp = (found[0].generation, None) if found and found[0].name == first else None
    return stamp, any(b.name[len(log):len(log) + 20].isdigit() for b in found if b.name != first)


def _storage_client() -> Any:
    """This thread's Google Cloud Storage client for the storage `STORAGE_EMULATOR_HOST` names (GCS itself when
    unset): made once, as making one looks up credentials."""
    from google.cloud import storage

    clients: dict[str | None, Any] = _held.__dict__.setdefault("clients", {})
    # The client reads the variable itself when it is made: a client is kept per value of it.
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if host not in clients:
        clients[host] = storage.Client()
    return clients[host]
