"""Which process on which host executes a run: recorded as run tags when the run's work starts.

A run killed outside Dagster's launcher (a `dagster job execute` killed by a signal, a power cut) stays STARTED
in the instance forever: nothing reports it, so its concurrency pool slot is never released and every sensor
that waits for it waits forever. With these tags, `orchestration.runs` can tell such a run from a live one.
"""

from __future__ import annotations

import os
import socket

import dagster as dg
import psutil

HOST_TAG, PID_TAG, PID_STARTED_TAG = "onceflow/host", "onceflow/pid", "onceflow/pid_started"


def record_worker(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> None:
    """Tag the run with this process: host, pid, and the pid's start time (pids are reused)."""
    context.instance.add_run_tags(context.run_id, {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(os.getpid()),
        PID_STARTED_TAG: f"{psutil.Process().create_time():.3f}",
    })


def worker_gone(tags: dict[str, str]) -> bool:
    """Whether the process a run's tags name is gone (only judged for this host's runs)."""
    if tags.get(HOST_TAG) != socket.gethostname() or PID_TAG not in tags:
        return False
    try:
        process = psutil.Process(int(tags[PID_TAG]))
    except psutil.NoSuchProcess:
        return True
    return abs(process.create_time() - float(tags.get(PID_STARTED_TAG, "0"))) > 1.0  # the pid was reused
