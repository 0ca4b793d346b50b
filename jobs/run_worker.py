"""Which process on which host executes a run: recorded as run tags when the run's work starts.

A run killed outside Dagster's launcher (a `dagster job execute` killed by a signal, a power cut) stays STARTED
in the instance forever: nothing reports it, so its concurrency pool slot is never released and every sensor
that waits for it waits forever. With these tags, `onceflow.orchestration.sensors.runs` can tell such a run from a live one.

Dagster copies a run's tags to its automatic retry, so the tags also name the run whose process they describe:
a retry not started yet carries its failed parent's dead pid, and must not be taken for dead because of it.
"""

from __future__ import annotations

import os
import socket

import dagster as dg
import psutil

HOST_TAG, PID_TAG, PID_STARTED_TAG = "onceflow/host", "onceflow/pid", "onceflow/pid_started"
RUN_TAG = "onceflow/worker_of"


def worker_tags(run_id: str, pid: int, started: float | None = None) -> dict[str, str]:
    """The tags that say process `pid` of this host, started at `started` (its start time, looked up if not given:
    pids are reused), executes run `run_id`."""
    started = psutil.Process(pid).create_time() if started is None else started
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(pid), PID_STARTED_TAG: f"{started:.3f}", RUN_TAG: run_id}


def record_worker(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> None:
    """Tag the run with this process."""
    context.instance.add_run_tags(context.run_id, worker_tags(context.run_id, os.getpid()))


def worker_gone(run_id: str, tags: dict[str, str]) -> bool:
    """Whether the process that run `run_id`'s tags name is gone (only judged for this host's runs, and only
    for tags its own worker wrote, not ones copied from the run it retries)."""
    if tags.get(HOST_TAG) != socket.gethostname() or PID_TAG not in tags or tags.get(RUN_TAG) != run_id:
        return False
    try:
        process = psutil.Process(int(tags[PID_TAG]))
    except psutil.NoSuchProcess:
        return True
    return abs(process.create_time() - float(tags.get(PID_STARTED_TAG, "0"))) > 1.0  # the pid was reused
