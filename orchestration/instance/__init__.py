"""The Dagster instance settings and workspace onceflow runs with, shipped in the package (`dagster.yaml`: run
retries, the queued run coordinator, onceflow's run launcher, pools; `dagster.prod.yaml`: the same on
PostgreSQL), so that an installed onceflow needs no checkout: `onceflow init` writes them into a project,
`onceflow dev`, `demo` and the local stack into the instance they start."""

from __future__ import annotations

import shutil
from pathlib import Path

INSTANCE_DIR = Path(__file__).resolve().parent
INSTANCE_CONFIGS = {"sqlite": INSTANCE_DIR / "dagster.yaml", "postgres": INSTANCE_DIR / "dagster.prod.yaml"}
BUNDLED_MODULE = "onceflow.orchestration.definitions"


def write_instance(dagster_home: Path, storage: str = "sqlite") -> Path:
    """`dagster_home/dagster.yaml` from onceflow's settings for `storage` (`sqlite`, or `postgres`: connection
    from the `DAGSTER_PG_*` variables)."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    target = dagster_home / "dagster.yaml"
    shutil.copyfile(INSTANCE_CONFIGS[storage], target)
    return target


def workspace_text(module: str = BUNDLED_MODULE, working_directory: Path | None = None) -> str:
    """A `workspace.yaml` loading the code location `module` (a module whose `defs` is its Definitions), imported
    from `working_directory` when given."""
    text = f"load_from:\n  - python_module:\n      module_name: {module}\n"
    return text + (f"      working_directory: {working_directory}\n" if working_directory else "")


def write_workspace(path: Path, module: str = BUNDLED_MODULE, working_directory: Path | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(workspace_text(module, working_directory))
    return path
