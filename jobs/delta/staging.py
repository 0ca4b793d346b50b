"""Staging tables inside a table: where an append over Spark Connect has Delta's writer write its files.

Each attempt writes a staging table at `<table>/onceflow-<uuid>/` (`onceflow.jobs.delta.transactions`), re-roots
its add actions to the table and deletes the staging log before committing. An attempt killed between creating
the staging table and deleting its log leaves that log behind: VACUUM removes the attempt's unreferenced data
files but never looks inside `_delta_log` directories. `remove_abandoned_staging` removes such logs, and staging
directories nothing is left in, once they are older than any attempt can run.
"""

from __future__ import annotations

import time
import uuid

import pyarrow as pa
from pyarrow import fs as pafs

from onceflow.resources.delta_storage import delta_table, table_files

PREFIX = "onceflow-"


def new_staging_directory() -> str:
    """A staging directory name no other attempt uses."""
    return f"{PREFIX}{uuid.uuid4().hex}"


def remove_abandoned_staging(path: str, older_than_s: int, now_s: float | None = None) -> int:
    """Remove the staging logs under the table at `path` whose newest file is older than `older_than_s`, in
    staging directories the table's current version does not reference; return how many were removed.

    Data files are left to VACUUM (a file an older version references stays readable within the retention);
    a staging directory is removed whole only when no file is left in it.
    """
    files, root = table_files(path)
    added = pa.table(delta_table(path).get_add_actions(flatten=False)).column("path")
    in_use = {name.split("/", 1)[0] for name in added.to_pylist()}
    cutoff_ns = ((time.time() if now_s is None else now_s) - older_than_s) * 1e9
    # One recursive listing: object storage has no directories to list one level of.
    staged: dict[str, list[pafs.FileInfo]] = {}
    folders: dict[str, pafs.FileInfo] = {}  # where the storage has directories (object storage has prefixes)
    for info in files.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        top = info.path[len(root) + 1 :].split("/", 1)[0]
        if not top.startswith(PREFIX) or top in in_use:
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
        # An attempt may still be writing or committing its log; a directory with no file yet may be being made.
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
