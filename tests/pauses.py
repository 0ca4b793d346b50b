"""Pause points from the test's side (`ONCEFLOW_PAUSE_AT`, `onceflow.resources.faults`): wait until a process is
held at a point, then let it go on."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_paused(home: Path, point: str, process: subprocess.Popen | None = None, timeout_s: float = 180) -> None:
    """Wait until a process is held at `point` under `home` (`process`, when given, must not end first)."""
    marker, deadline = home / "pauses" / f"{point}.paused", time.monotonic() + timeout_s
    while not marker.exists():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended ({process.returncode}) before it reached {point}:\n"
                                 f"{process.stdout.read()[-3000:] if process.stdout else ''}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing paused at {point} within {timeout_s}s")
        time.sleep(0.05)


def release(home: Path, point: str, timeout_s: float = 60) -> None:
    """Let the process held at `point` go on, once it has (its marker gone), for the next one to be held again."""
    pauses = home / "pauses"
    (pauses / f"{point}.release").write_bytes(b"")
    deadline = time.monotonic() + timeout_s
    while (pauses / f"{point}.paused").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (pauses / f"{point}.release").unlink()
