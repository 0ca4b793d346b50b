"""Run history stays bounded: `prune_runs` deletes finished micro-batch runs older than the retention, with their
event logs, and keeps runs in flight, newer runs and other jobs' runs, and the raw asset's materializations;
on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pytest

from onceflow.jobs.run_retention import PRUNE_JOB, build_run_retention_job, prune_runs
from onceflow.resources.emulators.postgres import PostgresServer
from tests.postgres import fresh_database, postgres, postgres_instance, query  # noqa: F401 (a fixture)

HOUR_S = 3600.0


@dg.op
def step() -> None:
    return None


@dg.op
def committing_step(context) -> None:
    for batch in (7, 8):  # as a micro-batch run records its batches
        context.log_event(dg.AssetMaterialization("raw_events", metadata={"batch_id": batch, "dagster/row_count": batch}))


@dg.op
def failing_step() -> None:
    raise RuntimeError("this micro-batch failed")


def finished_run(instance: dg.DagsterInstance, job_name: str, ok: bool = True) -> str:
    job = dg.GraphDefinition(name=job_name, node_defs=[step if ok else failing_step]).to_job()
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    assert result.success is ok
    return result.run_id


def run_in_flight(instance: dg.DagsterInstance, job_name: str) -> str:
    run = dg.DagsterRun(job_name=job_name, status=dg.DagsterRunStatus.STARTED)
    instance.add_run(run)
    return run.run_id


@pytest.fixture(params=["sqlite", "postgres"])
def instance(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dg.DagsterInstance:
    if request.param == "sqlite":
        return dg.DagsterInstance.local_temp(str(tmp_path))
    server: PostgresServer = request.getfixturevalue("postgres")
    return postgres_instance(fresh_database(server), tmp_path / "dagster", monkeypatch)


def test_old_finished_micro_batch_runs_are_deleted_and_the_rest_kept(instance: dg.DagsterInstance) -> None:
    old_done = [finished_run(instance, "ingest_events"), finished_run(instance, "ingest_events", ok=False),
                finished_run(instance, "ingest_orders")]
    old_in_flight = run_in_flight(instance, "ingest_events")
    old_other = finished_run(instance, "maintain_tables")
    time.sleep(1.0)
    cutoff_s = time.time()
    time.sleep(1.0)
    new_done = finished_run(instance, "ingest_events")
    assert all(instance.all_logs(run_id) for run_id in old_done)

    deleted = prune_runs(instance, ["ingest_events", "ingest_orders"], HOUR_S, now_s=cutoff_s + HOUR_S)

    assert deleted == 3
    assert set(instance.get_run_ids()) == {old_in_flight, old_other, new_done}
    assert all(instance.all_logs(run_id) == [] for run_id in old_done)  # their event logs went with them
    assert instance.all_logs(new_done)


def test_the_raw_assets_history_outlives_the_pruned_runs(instance: dg.DagsterInstance) -> None:
    job = dg.GraphDefinition(name="ingest_events", node_defs=[committing_step]).to_job()
    run_id = job.execute_in_process(instance=instance).run_id

    assert prune_runs(instance, ["ingest_events"], 0.0) == 1

    assert run_id not in instance.get_run_ids() and instance.all_logs(run_id) == []
    history = instance.fetch_materializations(dg.AssetKey("raw_events"), limit=10).records
    events = [(r.asset_materialization.metadata, r.run_id) for r in history if r.asset_materialization is not None]
    kept = sorted((metadata["batch_id"].value, metadata["pruned_run_id"].value, run) for metadata, run in events)
    assert kept == [(7, run_id, ""), (8, run_id, "")]  # every batch, run-less, naming the run that made it


def test_the_prune_job_deletes_every_finished_micro_batch_run_past_the_retention(
    instance: dg.DagsterInstance,
) -> None:
    done = [finished_run(instance, "ingest_events") for _ in range(3)]
    in_flight = run_in_flight(instance, "ingest_events")
    other = finished_run(instance, "ingest_orders")  # not a pipeline the job was built for
    time.sleep(0.5)
    job, schedule = build_run_retention_job(["ingest_events"], retention_h=0.1 / HOUR_S)
    assert schedule.job_name == PRUNE_JOB and schedule.cron_schedule == "41 * * * *"

    result = job.execute_in_process(instance=instance)

    assert result.success
    assert not set(done) & set(instance.get_run_ids())
    assert set(instance.get_run_ids()) == {in_flight, other, result.run_id}
    messages = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any("deleted 3 finished runs of ingest_events, prune_runs" in m for m in messages), messages


def test_postgres_holds_the_runs_and_loses_the_pruned_ones(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    database = fresh_database(postgres)
    instance = postgres_instance(database, tmp_path / "dagster", monkeypatch)
    kept, pruned = finished_run(instance, "ingest_orders"), finished_run(instance, "ingest_events")
    events = "SELECT count(*) FROM event_logs WHERE run_id = :run_id"
    assert query(database, events, run_id=pruned)[0][0] > 0

    prune_runs(instance, ["ingest_events"], 0.0)

    assert query(database, "SELECT run_id FROM runs WHERE run_id IN (:a, :b)", a=kept, b=pruned) == [(kept,)]
    assert query(database, events, run_id=pruned) == [(0,)]
    assert query(database, events, run_id=kept)[0][0] > 0
