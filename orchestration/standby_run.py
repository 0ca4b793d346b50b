"""A standby run process: a Python process that has loaded a code location's definitions and waits to execute one
run, so that a launched run does not spend seconds importing before its first step (see `run_launcher`).

`python -m onceflow.orchestration.standby_run <repository origin>` loads the definitions the serialized
`RepositoryPythonOrigin` points at, says `ready` on its stdout, then reads one serialized `ExecuteRunArgs` line from
stdin. If a Python module it loaded has changed on disk since, it says `stale` and ends: the run must run the code
on disk, as a freshly spawned process would. Otherwise it says `started` and executes that run exactly as `dagster
api execute_run` does (the same function, with Dagster's interrupt handling: SIGINT cancels the run). End of input
without a line (its launcher is gone) ends it. Once started, its stdout is its stderr: nothing reads the pipe any
more, and a run that prints must not block on it.
"""

from __future__ import annotations

import os
import sys

READY, STARTED, STALE = "ready", "started", "stale"


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


def main(serialized_origin: str) -> None:
    from dagster._cli.api import execute_run_command
    from dagster._core.origin import RepositoryPythonOrigin
    from dagster._serdes import deserialize_value
    from dagster._utils.hosted_user_process import recon_repository_from_origin

    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    recon_repository_from_origin(deserialize_value(serialized_origin, RepositoryPythonOrigin)).get_definition()
    loaded = module_files()
    print(READY, file=replies, flush=True)
    serialized_args = sys.stdin.readline().strip()
    if not serialized_args:
        return
    if changed(loaded):
        print(STALE, file=replies, flush=True)
        return
    print(STARTED, file=replies, flush=True)
    replies.close()
    execute_run_command.callback(input_json=serialized_args, compressed_input_json=None)


if __name__ == "__main__":
    main(sys.argv[1])
