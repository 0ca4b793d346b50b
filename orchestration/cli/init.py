"""`onceflow init`: a project's Dagster set-up from the installed package alone, so that `pip install onceflow`
needs no checkout. Writes `workspace.yaml` (the code location: the project's definitions module, else onceflow's
bundled one) and `.dagster/dagster.yaml` (the instance settings onceflow needs: run retries, the queued run
coordinator, onceflow's run launcher, pools; `--storage postgres` for the production instance). Files already
there are kept unless `--force`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from onceflow.orchestration.instance import BUNDLED_MODULE, write_instance, write_workspace

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class InitError(ValueError):
    """`onceflow init` cannot write the project's set-up; the message says why."""


def init_project(directory: Path, module: str = BUNDLED_MODULE, storage: str = "sqlite", force: bool = False) -> list[Path]:
    """Write the project's workspace and instance settings under `directory`; the paths written."""
    if not _MODULE.match(module):
        raise InitError(f"--module {module!r} is not a Python module path (my_project.definitions)")
    workspace, instance = directory / "workspace.yaml", directory / ".dagster" / "dagster.yaml"
    there = [str(p) for p in (workspace, instance) if p.exists()]
    if there and not force:
        raise InitError(f"{', '.join(there)} already there: keep them, or run `onceflow init --force`")
    # The project's modules import from its directory, wherever `dagster` is run from (Dagster takes a module's
    # working directory as written, not relative to the workspace file).
    return [write_workspace(workspace, module, directory.resolve()), write_instance(instance.parent, storage)]


def cmd_init(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    try:
        written = init_project(directory, args.module, args.storage, args.force)
    except InitError as error:
        print(f"onceflow init: {error}")
        return 2
    print("\n".join(f"wrote {path}" for path in written))
    print(f"next: export DAGSTER_HOME={directory / '.dagster'}; onceflow setup; dagster dev -w {written[0]}")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    init = sub.add_parser("init", help="write a project's workspace.yaml and Dagster instance settings")
    init.add_argument("dir", nargs="?", default=".", help="the project's directory (default: here)")
    init.add_argument("--module", default=BUNDLED_MODULE, help="the project's definitions module")
    init.add_argument("--storage", choices=("sqlite", "postgres"), default="sqlite",
                      help="the instance's storage (postgres: connection from DAGSTER_PG_* variables)")
    init.add_argument("--force", action="store_true", help="overwrite files already there")
    init.set_defaults(func=cmd_init)
