"""What sensors need to know about runs: is work of a kind still in flight?

A run is in flight while it is queued or running, and also after it failed if Dagster promised to retry it
(`dagster/will_retry`) and the retry does not exist yet: a sensor that started new work then would race the retry.
A run marked running whose process is gone (`onceflow.jobs.run_worker`), and a run of onceflow's that never began its
work within the start timeout (killed in its first second), are not in flight: each is reported failed, which
releases its concurrency pool slot.
"""

import re
import time

import dagster as dg

from onceflow.jobs.run_worker import PID_TAG, START_TIMEOUT_S, never_began, worker_gone

WILL_RETRY_TAG = "dagster/will_retry"
AUTO_RETRY_RUN_TAG = "dagster/auto_retry_run_id"
RETRY_GRACE_S = 120.0
"""How long a failed run marked `dagster/will_retry` may wait for its retry before it counts as final."""


def retry_pending(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """`run` failed and Dagster will retry it, but has not created the retry yet."""
    if run.status != dg.DagsterRunStatus.FAILURE or run.tags.get(WILL_RETRY_TAG) != "true":
        return False
    if AUTO_RETRY_RUN_TAG in run.tags:
        return False  # the retry exists: it is a run of its own
    if run.remote_job_origin is None:
        return False  # launched from the command line: Dagster cannot relaunch it, whatever the tag says
    record = instance.get_run_record_by_id(run.run_id)
    ended = record.end_time if record is not None else None
    return ended is None or time.time() - ended < RETRY_GRACE_S


def reap_if_dead(instance: dg.DagsterInstance, run: dg.DagsterRun, start_timeout_s: float = START_TIMEOUT_S) -> bool:
    """Report `run` failed if it is marked running but its process is gone, or never began its work within
    `start_timeout_s`; whether it was."""
    running = run.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING)
    if running and worker_gone(run.run_id, run.tags):
        why = f"the run's process {run.tags.get(PID_TAG)} is gone (killed without reporting)"
    elif never_began(instance, run, start_timeout_s):
        why = (f"the run never began its work: {run.status.value} for more than {start_timeout_s:.0f}s without "
               "recording its process (killed before its first step?)")
    else:
        return False
    instance.report_run_failed(run, message=f"onceflow: {why}")
    return True


def in_flight(
    instance: dg.DagsterInstance, runs: list[dg.DagsterRun], start_timeout_s: float = START_TIMEOUT_S
) -> str | None:
    """Why some run of `runs` is in flight, or None."""
    for run in runs:
        if not run.is_finished and not reap_if_dead(instance, run, start_timeout_s):
            return f"run {run.run_id} is {run.status.value}"
        if retry_pending(instance, run):
            return f"run {run.run_id} failed and Dagster will retry it"
    return None


def runs_tagged(instance: dg.DagsterInstance, tags: dict[str, str], limit: int = 100) -> list[dg.DagsterRun]:
    """The newest runs with all of `tags`, newest first."""
    return list(instance.get_runs(filters=dg.RunsFilter(tags=tags), limit=limit))


def run_worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of the process executing `run_id`, from the engine event its code server logs on starting it."""
    for entry in instance.all_logs(run_id):
        match = re.match(r"Started process for run \(pid: (\d+)\)", entry.message or "")
        if match:
            return int(match.group(1))
    return None


def build_dead_run_sensor(start_timeout_s: float = START_TIMEOUT_S) -> dg.SensorDefinition:
    @dg.sensor(
        name="dead_run_sensor",
        minimum_interval_seconds=15,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Reports runs failed whose process is gone without reporting (killed outside Dagster's "
        "launcher), or that never began their work, so they release their concurrency pools and sources.",
    )
    def dead_run_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        waiting = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
        running = context.instance.get_runs(filters=dg.RunsFilter(statuses=waiting))
        reaped = [run.run_id for run in running if reap_if_dead(context.instance, run, start_timeout_s)]
        return dg.SkipReason(f"reported failed: {', '.join(reaped)}" if reaped else "no dead runs")

    return dead_run_sensor
