"""A run killed in its first second: after Dagster created it, before its work recorded its process. It holds its
source for at most the start timeout (`onceflow.jobs.run_worker.never_began`), the next run says what it waits for
and then commits the source's records, and the dead-run sensor reports the killed run failed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from onceflow.jobs.run_worker import recorded
from onceflow.orchestration.sensors.runs import build_dead_run_sensor
from onceflow.orchestration.workload import make_events
from tests.delta_reader import read_rows
from tests.pipelines import dagster_micro_batch, events_from_files
from tests.test_windows import write_events

# Longer than the next run's own start-up on a loaded machine, so that it finds the killed run still holding the
# source and says what it waits for.
TIMEOUT_S = 40


def killed_at_creation(instance: dg.DagsterInstance, env: dict[str, str], tries: int = 3) -> dg.DagsterRun:
    """A `dagster job execute` SIGKILLed (its whole process group) the moment its run record appears in the
    instance's storage; tried again if the kill came after the run's work had begun."""
    for _ in range(tries):
        known = set(instance.get_run_ids())
        cli = subprocess.Popen(
            [sys.executable, "-m", "dagster", "job", "execute", "-m", "onceflow.orchestration.definitions",
             "-j", "ingest_events"], env=env, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        created = None
        while created is None and cli.poll() is None:
            created = next((r for r in instance.get_run_ids() if r not in known), None)
            time.sleep(0.005)
        os.killpg(cli.pid, signal.SIGKILL)
        cli.wait()
        assert created is not None, "the CLI ended before it created a run"
        run = instance.get_run_by_id(created)
        if not recorded(run):
            return run
    pytest.fail(f"the kill never landed before the run's work began in {tries} tries")


def test_a_run_killed_before_its_work_began_stops_holding_its_source(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = events_from_files(tmp_path, monkeypatch, max_files=10)
    events = make_events(40, int(time.time() * 1000) - 600_000, 60_000)
    write_events(directory / "1.jsonl", events)
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    monkeypatch.setenv("ONCEFLOW_RUN_START_TIMEOUT_S", str(TIMEOUT_S))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
        killed = killed_at_creation(instance, {**env, "DAGSTER_HOME": str(dagster_home)})
        assert killed.status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED)

        started = time.monotonic()
        done = dagster_micro_batch(str(home), None, dagster_home=str(dagster_home), timeout_s=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"waiting for its turn: run {killed.run_id} ({killed.status.value}, not begun" in done.stdout + done.stderr
        assert time.monotonic() - started < 120
        assert sorted(r[0] for r in read_rows(str(home / "lake" / "raw" / "events"), ["record_id"])) == sorted(
            e.event_id for e in events)

        result = build_dead_run_sensor(TIMEOUT_S)(dg.build_sensor_context(instance=instance))
        assert killed.run_id in result.skip_message
        assert instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
