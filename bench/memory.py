"""Peak resident memory of the driver (this Python process and the Spark JVM it started) while a benchmark runs.

Sampled by a thread every `INTERVAL_S`. The JVM seldom returns heap it grew: a contender that runs after one that
needed more shows the other's peak; `before` says what the process held when the run began.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

import psutil

INTERVAL_S = 0.1


def driver_rss() -> int:
    """Bytes resident in this process and the children of its session: the local Spark JVM and its Python workers,
    a drain in a process of its own. Servers (emulators, brokers, a standalone cluster, a Spark Connect engine)
    start sessions of their own (`start_new_session`): they are not the driver, and are left out."""
    me = psutil.Process()
    session = os.getsid(me.pid)
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            if os.getsid(child.pid) == session:
                total += child.memory_info().rss
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return total


class PeakRss:
    """`with PeakRss() as peak:` ... then `peak.before`, `peak.peak` (bytes)."""

    def __init__(self) -> None:
        self.before = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.peak = max(self.peak, driver_rss())

    def __enter__(self) -> PeakRss:
        self.before = self.peak = driver_rss()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, driver_rss())
