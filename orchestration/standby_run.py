"""A standby run process: a Python process that has imported Dagster's run execution and onceflow, and forks a
process for each run it is handed, so that a launched run neither imports for seconds before its first step nor has
another process import beside it while it works (see `run_launcher`).

`python -m onceflow.orchestration.standby_run <module>...` imports `PRELOADED` (importing, not loading, onceflow's
definitions: they are built on load) and the modules given (the launcher names those of its instance's storage and
other configured classes: a run builds its instance from them), and says `ready` on its stdout. Then, for each
serialized `ExecuteRunArgs` line on its stdin:

- if a Python module it imported has changed on disk since, it says `stale` and ends: a run must run the code on
  disk, as a freshly spawned process would;
- otherwise it forks. The child says `started <pid> <start time>` and executes that run exactly as `dagster api
  execute_run` does (the same function, with Dagster's interrupt handling: SIGINT cancels the run), then exits.

The child loads the code location's definitions itself, as a spawned process does: a definitions module is imported
afresh for every run, so it is always the code on disk, and what loading it starts (a client's thread, delta-rs's
runtime, a Spark session) belongs to the run's process and is never forked. Only the imports are shared, and they
are most of a spawned run's start-up. (The only threads they start are native allocators' and Arrow's, which
handle a fork themselves; this process starts no Python thread.)

End of input (its launcher is gone) ends it; its children run on. Its stdout is its stderr except for those replies,
so a run that prints never blocks on a pipe nobody reads.
"""

from __future__ import annotations

import os
import signal
import sys
from importlib import import_module
from typing import IO

import psutil

READY, STARTED, STALE = "ready", "started", "stale"
PRELOADED = ("dagster._cli.api", "onceflow.orchestration.definitions", "pyspark.sql.connect.session")
"""Dagster's run execution, everything onceflow's definitions import, and the Spark Connect client a run opens."""


def module_files() -> dict[str, int]:
    """The modification time of every loaded module's file."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            try:
                files[path] = os.stat(path).st_mtime_ns
            except OSError:
                continue  # not a file on disk (a zip import)
    return files


def changed(files: dict[str, int]) -> bool:
    """Whether any of `files` (from `module_files`) is modified or gone since."""
    for path, mtime_ns in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime_ns:
                return True
        except OSError:
            return True
    return False


def serve(replies: IO[str], loaded: dict[str, int]) -> str | None:
    """Fork a child per run handed on stdin (see the module docstring) while none of the `loaded` module files has
    changed. Returns that run's serialized `ExecuteRunArgs` in the child, None in this process when it ends."""
    # Children are reaped by the kernel: this process never waits for them, and it has no thread to do it with.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while serialized_args := sys.stdin.readline().strip():
        if changed(loaded):
            print(STALE, file=replies, flush=True)
            return None
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the run waits for its own children (a Spark JVM)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, sys.stdin.fileno())
            os.close(devnull)
            me = psutil.Process()
            print(f"{STARTED} {me.pid} {me.create_time():.3f}", file=replies, flush=True)
            replies.close()
            return serialized_args
    return None


def preload(modules: list[str]) -> None:
    """Import what a run imports before its definitions load: `PRELOADED` and `modules`."""
    for module in (*PRELOADED, *modules):
        import_module(module)


def main(modules: list[str]) -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    preload(modules)
    loaded = module_files()
    print(READY, file=replies, flush=True)
    serialized_args = serve(replies, loaded)
    if serialized_args:
        from dagster._cli.api import execute_run_command

        execute_run_command.callback(input_json=serialized_args, compressed_input_json=None)


if __name__ == "__main__":
    main(sys.argv[1:])
