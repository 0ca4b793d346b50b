"""Fault injection built into the product, at named points: `ONCEFLOW_CRASH_AT=<point>[#k]` kills the process
there, `ONCEFLOW_PAUSE_AT=<point>[#k]` holds it there until it is released; the k-th time (default: the first) the
process reaches the point.

A crash exits with `os._exit` (no cleanup, no flushing, no finally blocks), as a power cut or SIGKILL would. A
pause writes `<home>/pauses/<point>.paused` (the process's pid) and waits until `<home>/pauses/<point>.release`
exists (at most `PAUSE_LIMIT_S`, then it goes on and says so): races between two attempts, a checkpoint restored
under a running batch, a deploy between two attempts are then staged in order, without timing. Tests run with a
point set, then again without, and check that the outcome is exactly what a run without the fault gives.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

from onceflow.resources.object_store import open_store
from onceflow.resources.settings import FAULT_POINTS as POINTS
from onceflow.resources.settings import load_settings

CRASH_EXIT_CODE = 86
PAUSE_LIMIT_S = 600.0
PAUSE_POLL_S = 0.05
_reached: Counter[tuple[str, str]] = Counter()


def fault_point(point: str) -> None:
    """Exit at once if `ONCEFLOW_CRASH_AT` names this point, or wait to be released if `ONCEFLOW_PAUSE_AT` does
    (and this is the k-th time it is reached)."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    settings = load_settings()
    if _due("crash", settings.crash_at, point):
        sys.stderr.write(f"onceflow: crash injected at {point}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
    if _due("pause", settings.pause_at, point):
        _pause(settings.home_path, point)


def _due(kind: str, wanted: str | None, point: str) -> bool:
    if not wanted:
        return False
    name, _, nth = wanted.partition("#")
    if name != point:
        return False
    _reached[kind, point] += 1
    return _reached[kind, point] == int(nth or 1)


def _pause(home: str, point: str) -> None:
    store = open_store(f"{home}/pauses")
    store.write(f"{point}.paused", str(os.getpid()).encode())
    sys.stderr.write(f"onceflow: paused at {point} until {store.url(point + '.release')} exists\n")
    sys.stderr.flush()
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not store.exists(f"{point}.release"):
        if time.monotonic() > deadline:
            sys.stderr.write(f"onceflow: nobody released the pause at {point} in {PAUSE_LIMIT_S:.0f}s; going on\n")
            break
        time.sleep(PAUSE_POLL_S)
    store.delete(f"{point}.paused")
