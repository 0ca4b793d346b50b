"""Fault injection built into the product: `ONCEFLOW_CRASH_AT=<point>[#k]` kills the process at a named point.

The process exits with `os._exit` (no cleanup, no flushing, no finally blocks), as a power cut or SIGKILL would,
the k-th time (default: the first) it reaches the point. Tests run with a point set, then again without, and
check that the outcome is exactly what a run without the crash gives.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

from onceflow.resources.settings import CRASH_POINTS as POINTS
from onceflow.resources.settings import load_settings

CRASH_EXIT_CODE = 86
_reached: Counter[str] = Counter()


def crash_point(point: str) -> None:
    """Exit at once if `ONCEFLOW_CRASH_AT` names this point (and this is the k-th time it is reached)."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}")
    wanted = load_settings().crash_at
    if not wanted:
        return
    name, _, nth = wanted.partition("#")
    if name != point:
        return
    _reached[point] += 1
    if _reached[point] == int(nth or 1):
        sys.stderr.write(f"onceflow: crash injected at {point}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
