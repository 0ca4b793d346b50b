"""`commit_sensor` and the `finalize_commits` job on a real Dagster instance.

The sensor is evaluated against a real (temporary) instance and the runs it requests are executed on that
instance. Crashed runs are real: `dagster job launch` starts the run through the instance's run launcher in a
process of a real code server, the process exits at the crash point, and the code server reports the run failed
(as it does under `dagster dev` and the daemon).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from google.cloud import bigquery

from onceflow.assets.commits_check import COMMITS_NOT_QUARANTINED
from onceflow.jobs.finalize_job import FINALIZE_JOB, SEQUENCE_TAG, finalize_run_config
from onceflow.jobs.publish.commit_records import DONE, PENDING, QUARANTINED
from onceflow.jobs.publish.pane_sequence import BigQueryTarget
from onceflow.jobs.publish.sequence import FileFinalize
from onceflow.orchestration.definitions import definitions
from onceflow.orchestration.deployments import LAKE
from onceflow.orchestration.sensors.commit import build_commit_sensor
from onceflow.resources.spark_connect import SparkConnectServer
from tests.test_commit_steps import (
    ASSET,
    STEP_COUNT,
    WINDOW,
    assert_published_once,
    commit_store,
    publish,
    sink_files,
)

REPO = Path(__file__).resolve().parents[1]
# Runs start at once (no queue daemon here); `RETRIES` as in the project's dagster.yaml.
LAUNCH_NOW = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}
RETRIES = {"run_retries": {"enabled": True, "max_retries": 2, "retry_on_asset_or_op_failure": True}}


@pytest.fixture(autouse=True)
def warm_engine(spark_connect: SparkConnectServer) -> None:
    """Loading the definitions checks the transforms with Spark; this (and every process launched) uses the
    warm engine."""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ONCEFLOW_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def target(bigquery_client: bigquery.Client, monkeypatch: pytest.MonkeyPatch) -> BigQueryTarget:
    """A new dataset, which the definitions' BigQuery resource is pointed at (the emulator fixture set the host)."""
    import uuid

    dataset = bigquery_client.create_dataset(f"test_{uuid.uuid4().hex[:12]}").dataset_id
    monkeypatch.setenv("ONCEFLOW_BIGQUERY_PROJECT", bigquery_client.project)
    monkeypatch.setenv("ONCEFLOW_BIGQUERY_DATASET", dataset)
    return BigQueryTarget(bigquery_client.project, dataset, ASSET)


def dagster_instance(tmp_path: Path, overrides: dict) -> Iterator[dg.DagsterInstance]:
    """The settings are also written to the instance's dagster.yaml: processes launched on it (`launch`) load them,
    so a run they fail is marked for retry exactly as the daemon's instance would mark it."""
    settings = {**LAUNCH_NOW, **overrides}
    (tmp_path / "dagster").mkdir()
    (tmp_path / "dagster" / "dagster.yaml").write_text(json.dumps(settings))  # JSON is YAML
    with dg.instance_for_test(overrides=settings, temp_dir=str(tmp_path / "dagster")) as inst:
        yield inst


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """An instance without run retries: a failed run is final."""
    yield from dagster_instance(tmp_path, {})


@pytest.fixture
def retrying_instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    yield from dagster_instance(tmp_path, RETRIES)


def evaluate(instance: dg.DagsterInstance, home: Path, cursor: str | None = None):
    """One tick as the daemon evaluates it, run requests resolved against the sensor's target."""
    from onceflow.resources.lake import LakeResource

    sensor = build_commit_sensor([ASSET])
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={LAKE: LakeResource(home=str(home))})
    return sensor.evaluate_tick(context)


def execute(instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    """Run what the sensor requested, as the daemon would, on the same instance (in this process)."""
    job = definitions().get_job_def(FINALIZE_JOB)
    tags = {**request.tags, "dagster/run_key": request.run_key or ""}
    return job.execute_in_process(run_config=request.run_config, instance=instance, tags=tags, raise_on_error=False)


def retried_by_dagster(instance: dg.DagsterInstance, failed: dg.DagsterRun) -> dg.DagsterRun:
    """What Dagster's retry daemon does with a failed run marked for retry (its own `retry_run`): a re-execution
    from failure launched in the workspace's code location; wait until it finished."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import retry_run

    with WorkspaceProcessContext(instance, WorkspaceFileTarget([str(REPO / "workspace.yaml")])) as workspace:
        retry_run(instance.get_run_by_id(failed.run_id), workspace)
        retry_id = instance.get_run_by_id(failed.run_id).tags["dagster/auto_retry_run_id"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            retry = instance.get_run_by_id(retry_id)
            if retry.is_finished:
                return retry
            time.sleep(0.5)
    raise AssertionError(f"Dagster's retry {retry_id} of {failed.run_id} did not finish")


def launch(
    instance: dg.DagsterInstance, home: Path, sequence_id: str, crash_at: str | None = None, copies: int = 1
) -> list[dg.DagsterRun]:
    """`dagster job launch` of a finalize run, `copies` times at once, optionally with a crash point set; wait
    until the runs finished (a crashed run is reported failed by the code server that ran it)."""
    config = home / "finalize.json"
    config.write_text(json.dumps(finalize_run_config(sequence_id)))
    env = {**os.environ, "DAGSTER_HOME": str(instance.root_directory)}
    for inherited in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "ONCEFLOW_CRASH_AT"):
        env.pop(inherited, None)
    if crash_at:
        env["ONCEFLOW_CRASH_AT"] = crash_at
    before = {r.run_id for r in instance.get_runs()}
    command = [sys.executable, "-m", "dagster", "job", "launch", "-w", str(REPO / "workspace.yaml"),
               "-j", FINALIZE_JOB, "-c", str(config), "--tags", json.dumps({SEQUENCE_TAG: sequence_id})]
    processes = [
        subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(copies)
    ]
    for process in processes:
        output, _ = process.communicate(timeout=180)
        assert process.returncode == 0, output[-3000:]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = [r for r in instance.get_runs() if r.run_id not in before]
        if len(runs) == copies and all(r.is_finished for r in runs):
            return runs
        time.sleep(0.5)
    raise AssertionError(f"the launched runs did not finish: {runs}")


def only_request(result: dg.SensorResult) -> dg.RunRequest:
    assert len(result.run_requests or []) == 1, result
    return result.run_requests[0]


def quarantine_checks(result: dg.SensorResult) -> list[tuple[bool, list[str]]]:
    return [
        (e.passed, list(e.metadata["quarantined_sequences"].value))
        for e in result.asset_events
        if isinstance(e, dg.AssetCheckEvaluation) and e.check_name == COMMITS_NOT_QUARANTINED
    ]


def move_aside(home: Path, step: FileFinalize) -> tuple[Path, Path]:
    """Make a step fail for as long as its temp file is elsewhere."""
    temp = home / "published" / step.temp_key
    aside = temp.with_name(temp.name + ".aside")
    temp.rename(aside)
    return aside, temp


# Killed after each kind of step (a file shard, the BigQuery load, the watermark): what the sensor drives is the same
# for a second shard as for the first, and `test_commit_steps` crashes after every step.
@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3, STEP_COUNT])
def test_a_run_killed_after_step_k_is_recovered_by_the_sensor(
    k: int, home: Path, target: BigQueryTarget, bigquery_client: bigquery.Client, instance: dg.DagsterInstance
) -> None:
    sequence = publish(home, target).sequence
    [crashed] = launch(instance, home, sequence.id, f"commit.after_step#{k}")
    assert crashed.status == dg.DagsterRunStatus.FAILURE
    store = commit_store(home)
    state = store.state(sequence.id)
    assert state.steps == tuple([DONE] * (k - 1) + [PENDING] * (STEP_COUNT - k + 1))
    assert [(a.number, a.run_id, a.outcome) for a in state.attempts] == [(1, crashed.run_id, None)]

    request = only_request(evaluate(instance, home))
    assert request.run_key == f"{sequence.id}:attempt:2"
    assert request.tags[SEQUENCE_TAG] == sequence.id
    state = store.state(sequence.id)
    assert state.attempts[0].outcome == "failed" and "without finishing" in (state.attempts[0].error or "")
    assert execute(instance, request).success

    assert_published_once(home, bigquery_client, target)
    assert store.state(sequence.id).status == DONE
    result = evaluate(instance, home)
    assert not result.run_requests
    assert store.unfinished() == []


@pytest.mark.slow
def test_a_crash_after_writing_the_sequence_is_published_by_the_sensor(
    home: Path, target: BigQueryTarget, bigquery_client: bigquery.Client, instance: dg.DagsterInstance
) -> None:
    sequence = publish(home, target).sequence  # written, no step run: what commit.after_write_sequence leaves
    request = only_request(evaluate(instance, home))
    assert request.run_key == f"{sequence.id}:attempt:1"
    assert execute(instance, request).success
    assert_published_once(home, bigquery_client, target)


def test_a_step_that_always_fails_is_quarantined_then_rearmed_and_completes(
    home: Path, target: BigQueryTarget, bigquery_client: bigquery.Client, instance: dg.DagsterInstance
) -> None:
    sequence = publish(home, target, max_attempts=3).sequence
    first = sequence.steps[0]
    assert isinstance(first, FileFinalize)
    aside, temp = move_aside(home, first)
    store = commit_store(home)

    cursor = None
    for k in (1, 2, 3):
        result = evaluate(instance, home, cursor)
        cursor = result.cursor
        request = only_request(result)
        assert request.run_key == f"{sequence.id}:attempt:{k}"
        assert not execute(instance, request).success
    state = store.state(sequence.id)
    assert state.status == QUARANTINED and "3 of 3 attempts failed" in (state.quarantine_reason or "")
    assert "FileNotFoundError" in (state.last_error or "")

    result = evaluate(instance, home, cursor)
    assert not result.run_requests
    assert quarantine_checks(result) == [(False, [sequence.id])]
    assert store.quarantined() == [sequence.id]
    status = subprocess.run(
        [sys.executable, "-m", "onceflow", "commits", "list"], cwd=REPO, capture_output=True, text=True
    )
    assert f"{sequence.id}  quarantined" in status.stdout and "FileNotFoundError" in status.stdout
    assert quarantine_checks(evaluate(instance, home, result.cursor)) == []  # reported on change only

    aside.rename(temp)  # the operator fixes the cause ...
    rearm = subprocess.run(
        [sys.executable, "-m", "onceflow", "commits", "retry", sequence.id],
        cwd=REPO, capture_output=True, text=True,
    )
    assert rearm.returncode == 0, rearm.stdout + rearm.stderr  # ... and re-arms it
    result = evaluate(instance, home, result.cursor)
    request = only_request(result)
    assert request.run_key == f"{sequence.id}:attempt:4"
    assert quarantine_checks(result) == [(True, [])]
    assert execute(instance, request).success
    assert_published_once(home, bigquery_client, target)
    state = store.state(sequence.id)
    assert state.status == DONE and state.lineages == 4 and [e.event for e in state.history] == ["quarantined", "rearmed"]


@pytest.mark.slow
def test_two_finalize_runs_of_one_sequence_at_once_publish_exactly_once(
    home: Path, target: BigQueryTarget, bigquery_client: bigquery.Client, instance: dg.DagsterInstance
) -> None:
    sequence = publish(home, target).sequence
    runs = launch(instance, home, sequence.id, copies=2)
    assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS] * 2
    assert_published_once(home, bigquery_client, target)
    state = commit_store(home).state(sequence.id)
    assert state.status == DONE and all(a.outcome == DONE for a in state.attempts)
    assert {a.run_id for a in state.attempts} <= {r.run_id for r in runs}
    assert not evaluate(instance, home).run_requests


def test_retries_of_a_run_by_dagster_are_one_attempt_lineage(
    home: Path, target: BigQueryTarget, bigquery_client: bigquery.Client, retrying_instance: dg.DagsterInstance
) -> None:
    instance = retrying_instance
    sequence = publish(home, target).sequence
    first = sequence.steps[0]
    assert isinstance(first, FileFinalize)
    aside, temp = move_aside(home, first)
    request = only_request(evaluate(instance, home))
    assert request.run_config == finalize_run_config(sequence.id)
    # Launched through a code location, as the daemon launches it: Dagster can retry only such a run.
    [failed] = launch(instance, home, sequence.id)
    assert failed.status == dg.DagsterRunStatus.FAILURE
    assert failed.tags.get("dagster/will_retry") == "true"
    result = evaluate(instance, home)
    assert not result.run_requests  # Dagster will retry the run: not a final failure, no new lineage

    # Dagster's retries, by the retry daemon's own code: re-executions from failure in the failed run's group.
    parent = failed
    for retry_number in (1, 2):
        if retry_number == 2:
            aside.rename(temp)  # the cause goes away before the second retry
        parent = retried_by_dagster(instance, parent)
        assert parent.tags.get("dagster/retry_number") == str(retry_number)
        assert (parent.status == dg.DagsterRunStatus.SUCCESS) == (retry_number == 2)
        assert not evaluate(instance, home).run_requests

    state = commit_store(home).state(sequence.id)
    assert state.status == DONE
    assert [(a.number, a.root_run_id, a.outcome) for a in state.attempts] == [
        (1, failed.run_id, "failed"), (1, failed.run_id, "failed"), (1, failed.run_id, "done")
    ]
    assert state.lineages == 1 and state.attempts_used == 1
    assert sink_files(home) and commit_store(home).published_through(ASSET) == WINDOW.end_ms
    assert not evaluate(instance, home).run_requests
