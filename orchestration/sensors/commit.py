"""`commit_sensor`: finds commit sequences nobody is working on and launches a finalize run for each.

Run-level retry tracking, per sequence:

- A sequence is busy while a run tagged with it is queued or running, while a failed one awaits the retry Dagster
  promised (`dagster/will_retry`, no retry run yet), or while a run holding an open attempt (the publishing asset
  run, which tries once itself) is still going. Busy sequences are left alone.
- A run that ended without reporting its attempt (its process was killed, or it died before starting one) is
  recorded as a failed attempt on its behalf, in its lineage: retries of one run (same `dagster/root_run_id`) are
  one attempt lineage, and only a lineage's final failure leaves the sequence to the next lineage.
- Otherwise the next lineage is requested with run key `<sequence>:attempt:<k>`; when the budget is used up the
  sequence is quarantined instead, which the `commits_not_quarantined` check reports. Attempts that found a sink
  unreachable use no budget; after them the next one waits, longer each time (`unavailable_wait_s`).

The sensor's cursor holds the quarantined sequences per asset, so the check is reported when they change.
"""

import json

import dagster as dg

from onceflow.assets.commits_check import quarantine_evaluation, quarantined_of
from onceflow.jobs.finalize_job import FINALIZE_JOB, SEQUENCE_TAG, finalize_run_config
from onceflow.jobs.publish.commit_records import PENDING, SequenceState, unavailable_wait_s
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import sequence_asset
from onceflow.jobs.run_worker import START_TIMEOUT_S
from onceflow.orchestration.sensors.runs import in_flight, runs_tagged
from onceflow.resources.lake import LakeResource


def _busy(
    instance: dg.DagsterInstance, state: SequenceState, runs: list[dg.DagsterRun], start_timeout_s: float
) -> str | None:
    """Why the sequence is being worked on, or None."""
    busy = in_flight(instance, runs, start_timeout_s)
    if busy:
        return busy
    for attempt in state.attempts:
        if attempt.outcome is None:
            run = instance.get_run_by_id(attempt.run_id)
            if run is not None and not run.is_finished:
                return f"run {attempt.run_id} holds attempt {attempt.number}"
    return None


def _record_dead_runs(
    store: CommitStore, instance: dg.DagsterInstance, state: SequenceState, runs: list[dg.DagsterRun]
) -> None:
    """Fail, on their behalf, attempts of runs that ended without reporting (the sequence is not busy, so every
    run it knows of has finished)."""
    reported = {a.run_id for a in state.attempts if a.outcome is not None}
    dead: dict[str, tuple[str, str]] = {}  # run id -> (root run id, how it ended)
    for run in reversed(runs):  # oldest first: lineages are numbered in the order the runs started
        if run.status != dg.DagsterRunStatus.SUCCESS:
            dead[run.run_id] = (run.root_run_id or run.run_id, run.status.value)
    for attempt in state.attempts:
        if attempt.outcome is None and attempt.run_id not in dead:
            run = instance.get_run_by_id(attempt.run_id)
            # A run this instance does not know cannot be asked; the sequence not being busy, its attempt is over.
            dead[attempt.run_id] = (attempt.root_run_id, run.status.value if run else "unknown to this instance")
    for run_id, (root, how) in dead.items():
        if run_id not in reported:
            store.record_dead_run(state.sequence_id, run_id, root, f"run {run_id} ended ({how}) without finishing")


def plan_sequence(
    store: CommitStore, instance: dg.DagsterInstance, seq: str, start_timeout_s: float = START_TIMEOUT_S
) -> dg.RunRequest | dg.SkipReason:
    """What the sensor does about one unfinished sequence: a run request, or why not."""
    runs = runs_tagged(instance, {SEQUENCE_TAG: seq})
    state = store.state(seq)
    busy = _busy(instance, state, runs, start_timeout_s)
    if busy:
        return dg.SkipReason(f"{seq}: {busy}")
    _record_dead_runs(store, instance, state, runs)
    state = store.state(seq)
    if state.status == PENDING and state.attempts_used >= state.max_attempts:
        state = store.quarantine(seq, f"{state.attempts_used} of {state.max_attempts} attempts used; last "
                                      f"error: {state.last_error or 'none recorded (the runs died)'}")
    if state.status != PENDING:
        return dg.SkipReason(f"{seq}: {state.status}")
    wait_s = unavailable_wait_s(state)
    if wait_s > 0:
        return dg.SkipReason(f"{seq}: a sink could not be reached; the next attempt in {wait_s:.0f}s")
    return dg.RunRequest(
        run_key=f"{seq}:attempt:{state.next_attempt}",
        job_name=FINALIZE_JOB,
        run_config=finalize_run_config(seq),
        tags={SEQUENCE_TAG: seq, "onceflow/asset": sequence_asset(seq)},
    )


def build_commit_sensor(assets: list[str], start_timeout_s: float = START_TIMEOUT_S) -> dg.SensorDefinition:
    """The one commit sensor of a code location; `assets` are its window assets (their quarantine checks)."""
    assets = sorted(assets)

    @dg.sensor(
        name="commit_sensor",
        job_name=FINALIZE_JOB,
        minimum_interval_seconds=10,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Finishes commit sequences left unfinished; quarantines those that use up their attempts.",
    )
    def commit_sensor(context: dg.SensorEvaluationContext, onceflow_lake: LakeResource) -> dg.SensorResult:
        store = CommitStore(onceflow_lake.commits())
        requests: list[dg.RunRequest] = []
        skips: list[str] = []
        for seq in store.unfinished():
            planned = plan_sequence(store, context.instance, seq, start_timeout_s)
            if isinstance(planned, dg.RunRequest):
                requests.append(planned)
            else:
                skips.append(planned.skip_message or "")
        previous = json.loads(context.cursor) if context.cursor else {}
        now = {asset: quarantined_of(store, asset) for asset in assets}
        events = [quarantine_evaluation(store, a) for a in assets if previous.get(a) != now[a]]
        if skips:
            context.log.info("; ".join(skips))
        return dg.SensorResult(
            run_requests=requests,
            asset_events=events,
            cursor=json.dumps(now, sort_keys=True),
            skip_reason=None if requests or events else (skips[0] if skips else "no unfinished commit sequences"),
        )

    return commit_sensor
