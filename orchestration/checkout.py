"""The checkout onceflow runs from: `dagster.yaml`, `workspace.yaml`, `deploy/` and `bench/` are files of the
repository, not of the installed package, so the commands that need them (`onceflow dev`, `demo`, the local
stack) find them here."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
