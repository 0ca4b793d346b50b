"""Staging tables inside a table: where an append over Spark Connect has Delta's writer write its files.

A Spark Connect client cannot reach the writer of a Delta transaction, so `write_staged` has Delta's writer append
the rows to a staging table at `<table>/onceflow-<uuid>/` and returns that commit's add actions, re-rooted to the
table, for delta-rs to commit (`onceflow.jobs.delta.transactions.append_once`). A process keeps writing one staging
table per table for a while: a fresh table costs Delta's writer a log to load on every append, about a third of a
small batch's write. Its log is removed when the process exits; one killed before that leaves it behind, and VACUUM
never looks inside `_delta_log` directories. `remove_abandoned_staging` removes such logs, and staging directories
nothing is left in, once they are older than any process goes on writing them (`REUSE_FOR_S`).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field

from deltalake import DeltaTable
from deltalake.transaction import AddAction
from pyarrow import fs as pafs
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from onceflow.jobs.delta.schema_evolution import conform
from onceflow.jobs.delta.table_features import complete_protocol
from onceflow.resources.delta_storage import delta_table, storage_options, table_files
from onceflow.resources.faults import fault_point

PREFIX = "onceflow-"
REUSE_FOR_S = 600  # a staging table idle this long is not written again; maintenance waits far longer
REUSE_WRITES = 100  # then a new one: its log is replayed without a checkpoint
_NO_CHECKPOINTS = {"delta.checkpointInterval": str(REUSE_WRITES * 10)}  # no checkpoint job in the append


@dataclass
class _Staging:
    """This process's staging table of one table: its directory, the definition it was made for, its writes."""

    directory: str
    definition: tuple
    version: int  # of its log: this process is its only writer
    writes: int = 0
    last_write_s: float = 0.0
    pid: int = field(default_factory=os.getpid)  # a forked child makes its own


_staging: dict[str, _Staging] = {}
_locks: dict[str, threading.Lock] = {}


def write_staged(df: DataFrame, table: DeltaTable, definition: tuple) -> list[AddAction]:
    """Write `df` as data files of `table` with Delta's writer, uncommitted: their add actions.

    `definition` is what the files depend on (schema, partitioning, settings, protocol): a staging table made for
    another one is not written again. Files are written as on a classic session: partitioned, with Delta's
    statistics and constraint checks, and without renames (which object storage pays for, and the GCS emulator
    refuses). An attempt that never commits leaves unreferenced files, which VACUUM removes as it removes those of
    a failed Delta write.
    """
    path = table.table_uri.rstrip("/")
    with _locks.setdefault(path, threading.Lock()):  # one append at a time per staging table
        staging = _staging.get(path)
        if staging is not None and staging.pid != os.getpid():
            staging = None
        if staging is None or staging.definition != definition or staging.writes >= REUSE_WRITES or (
            time.monotonic() - staging.last_write_s > REUSE_FOR_S
        ):
            if staging is not None:
                _remove_log(path, staging)
            directory, version = _create(path, table)
            staging = _staging[path] = _Staging(directory, definition, version)
        try:
            schema = T.StructType.fromJson(json.loads(table.schema().to_json()))
            conform(df, schema, path).write.format("delta").mode("append").save(f"{path}/{staging.directory}")
            fault_point("ingest.append_staged")
            adds = _added(f"{path}/{staging.directory}", staging.version + 1)
            staging.version += adds is not None
            staging.writes += 1
        except BaseException:
            del _staging[path]  # in an unknown state: the next append makes another
            raise
        staging.last_write_s = time.monotonic()
    return [AddAction(f"{staging.directory}/{add['path']}", add["size"], add["partitionValues"],
                      add["modificationTime"], add["dataChange"], add["stats"]) for add in adds or ()]


def _create(path: str, table: DeltaTable) -> tuple[str, int]:
    """A new staging table inside the table at `path`, with its schema, partitioning and settings; its directory
    and version."""
    directory = new_staging_directory()
    schema, metadata = T.StructType.fromJson(json.loads(table.schema().to_json())), table.metadata()
    staging = f"{path}/{directory}"
    created = DeltaTable.create(staging, table.schema(), mode="error", partition_by=metadata.partition_columns or None,
                                configuration={**metadata.configuration, **_NO_CHECKPOINTS},
                                storage_options=storage_options(staging))
    complete_protocol(created, schema)
    return directory, delta_table(staging).version()


def _added(staging: str, version: int) -> list[dict] | None:
    """The add actions of the staging table's commit `version` (this process is its only writer); None when there
    is no such commit (Delta commits no append that wrote no file)."""
    files, root = table_files(staging)
    commit_file = f"{root}/_delta_log/{version:020d}.json"
    try:
        with files.open_input_stream(commit_file) as commit:
            actions = [json.loads(line) for line in commit.read().decode().splitlines() if line.strip()]
    except OSError:  # object storage names a missing object in its own words
        if files.get_file_info(commit_file).type != pafs.FileType.NotFound:
            raise
        return None
    return [action["add"] for action in actions if "add" in action]


@atexit.register
def _remove_logs() -> None:
    """Remove this process's staging logs as it exits (their files stay: the table references them)."""
    for path, staging in _staging.items():
        if staging.pid == os.getpid():
            _remove_log(path, staging)


def _remove_log(path: str, staging: _Staging) -> None:
    files, root = table_files(f"{path}/{staging.directory}")
    try:
        for info in files.get_file_info(pafs.FileSelector(f"{root}/_delta_log", recursive=True)):
            files.delete_file(info.path)
        files.delete_dir(f"{root}/_delta_log")  # local disk; object storage has no directory left
    except OSError:
        pass  # maintenance removes what is left


def new_staging_directory() -> str:
    """A staging directory name no other attempt uses."""
    return f"{PREFIX}{uuid.uuid4().hex}"


def remove_abandoned_staging(path: str, older_than_s: int, now_s: float | None = None) -> int:
    """Remove the staging logs under the table at `path` whose newest file is older than `older_than_s` (no
    process writes a staging table that long after its last write); return how many were removed.

    Data files are left to VACUUM (a file an older version references stays readable within the retention);
    a staging directory is removed whole when no file is left in it.
    """
    if older_than_s <= REUSE_FOR_S:
        raise ValueError(f"older_than_s must exceed {REUSE_FOR_S} s, while a process may still write a staging table")
    files, root = table_files(path)
    cutoff_ns = ((time.time() if now_s is None else now_s) - older_than_s) * 1e9
    # One recursive listing: object storage has no directories to list one level of.
    staged: dict[str, list[pafs.FileInfo]] = {}
    folders: dict[str, pafs.FileInfo] = {}  # where the storage has directories (object storage has prefixes)
    for info in files.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        top = info.path[len(root) + 1 :].split("/", 1)[0]
        if not top.startswith(PREFIX):
            continue
        staged.setdefault(top, [])
        if info.type == pafs.FileType.File:
            staged[top].append(info)
        else:
            folders[info.path] = info
    removed = 0
    for top, inside in staged.items():
        directory, log_directory = f"{root}/{top}", f"{root}/{top}/_delta_log"
        log = [f for f in inside if f.path.startswith(f"{log_directory}/")]
        # A process may still be writing its log; a directory with no file yet may be being made.
        if log:
            stamps = [f.mtime_ns for f in log]
        elif not inside and directory in folders:
            stamps = [folders[directory].mtime_ns]
        else:
            continue  # data files only: VACUUM's to remove
        if any(stamp is None or stamp >= cutoff_ns for stamp in stamps):
            continue
        for info in log:  # file by file: on object storage a directory is only a prefix
            files.delete_file(info.path)
        removed += bool(log)
        if len(inside) == len(log) and directory in folders:
            files.delete_dir(directory)  # nothing is left in it
        elif log_directory in folders:
            files.delete_dir(log_directory)
    return removed
