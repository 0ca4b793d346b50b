"""The stage order (`jobs/__init__.py`) and the folders' (DESIGN 2) are checked: import-linter's contracts in
pyproject.toml, over the package as installed. No Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.installed_layout import REPO, installed_layout


def test_imports_keep_the_folder_and_stage_order(tmp_path: Path) -> None:
    installed_layout(tmp_path / "site")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--config", str(REPO / "pyproject.toml")],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout
