"""Which process on which host executes a run: recorded as run tags when the run's work starts.

A run killed outside Dagster's launcher (a `dagster job execute` killed by a signal, a power cut) stays STARTED
in the instance forever: nothing reports it, so its concurrency pool slot is never released and every sensor
that waits for it waits forever. With these tags, `onceflow.orchestration.sensors.runs` can tell such a run from a live one.

Dagster copies a run's tags to its automatic retry, so the tags also name the run whose process they describe:
a retry not started yet carries its failed parent's dead pid, and must not be taken for dead because of it.

A run killed before its work began (a `dagster job execute` killed in its first second, after Dagster created the
run and before its op ran) has no such tags to judge it by. Such a run of onceflow's counts as never begun
(`never_began`) once it has been waiting longer than `START_TIMEOUT_S` (`ONCEFLOW_RUN_START_TIMEOUT_S`) since it
was created, left the queue, or started, without recording its worker: Dagster's own run monitoring gives a
launched run as long (`start_timeout_seconds`). A queued run waits in Dagster's queue and is never judged so.
"""

from __future__ import annotations

import os
import socket
import time

import dagster as dg
import psutil

HOST_TAG, PID_TAG, PID_STARTED_TAG = "onceflow/host", "onceflow/pid", "onceflow/pid_started"
RUN_TAG = "onceflow/worker_of"
WORK_TAGS = ("onceflow/source", "onceflow/window_asset", "onceflow/commit_sequence")
"""One of these tags marks a run of onceflow's (a micro-batch, a window pane, a commit sequence's finalizer): its
work records its worker first thing."""
START_TIMEOUT_S = 180.0
_BEFORE_WORK = (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


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


def recorded(run: dg.DagsterRun) -> bool:
    """Whether the run's own worker recorded itself (tags copied from the run it retries do not count)."""
    return run.tags.get(RUN_TAG) == run.run_id


def waiting_since(record: dg.RunRecord) -> float:
    """Since when (epoch s) a run not yet at work has been waiting in its present state: created (NOT_STARTED),
    out of the queue (STARTING) or started (STARTED)."""
    status = record.dagster_run.status
    if status == dg.DagsterRunStatus.STARTED and record.start_time is not None:
        return record.start_time
    moment = record.update_timestamp if status == dg.DagsterRunStatus.STARTING else record.create_timestamp
    return moment.timestamp()


def never_began(instance: dg.DagsterInstance, run: dg.DagsterRun, start_timeout_s: float = START_TIMEOUT_S) -> bool:
    """Whether `run`, a run of onceflow's that has not recorded its worker, has waited longer than `start_timeout_s`
    to begin its work (see the module docstring): its process died before it began, or never ran."""
    if recorded(run) or run.status not in _BEFORE_WORK or not any(tag in run.tags for tag in WORK_TAGS):
        return False
    record = instance.get_run_record_by_id(run.run_id)
    return record is not None and time.time() - waiting_since(record) > start_timeout_s
