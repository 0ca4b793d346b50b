"""The package laid out as installed (`onceflow.jobs` is `jobs/`, ...), for tools that read it from the file system
(a type checker, the import contract) and cannot follow the editable install's import hook."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def installed_layout(root: Path) -> Path:
    """The package as installed (`onceflow.jobs` is `jobs/`, ...): links, since mypy cannot follow the editable
    install's import hook."""
    package = root / "onceflow"
    package.mkdir(parents=True)
    for path in (REPO / "onceflow").iterdir():
        (package / path.name).symlink_to(path)
    for folder in ("orchestration", "assets", "jobs", "resources"):
        (package / folder).symlink_to(REPO / folder)
    return package
