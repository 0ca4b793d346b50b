"""Record outputs end to end (DESIGN 6b): every record a raw batch inserted reaches a real PostgreSQL (upsert and
append), a real Kafka broker, Parquet files and the BigQuery emulator exactly once, through `dagster job execute` runs killed inside each
sink's commit and between the sequence's steps, then finished by the runs the commit sensor asks for.

Read back by independent readers: psycopg, a `read_committed` consumer, pyarrow, the BigQuery client; the markers balance the batches.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import dagster as dg
import psycopg
import pyarrow.parquet as pq
import pytest
from google.cloud import bigquery

from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.orchestration.sensors.commit import plan_sequence
from onceflow.orchestration.sensors.runs import reap_if_dead
from onceflow.resources.emulators.kafka import KafkaBroker
from onceflow.resources.emulators.postgres import PostgresServer
from onceflow.resources.object_store import open_store
from onceflow.resources.spark_connect import SparkConnectServer
from tests.pipelines import dagster_cli, dagster_micro_batch, onceflow_cli, sensor_wants
from tests.postgres import fresh_database, postgres  # noqa: F401 - a fixture
from tests.test_kafka_sink import committed_records

pytestmark = pytest.mark.engine_paths


def order(n: int, qty: int = 2, shop: str = "north") -> str:
    return json.dumps({"order_id": f"o{n}", "ts": 1_795_000_000_000 + n * 1000, "shop": shop, "qty": qty,
                       "price": "1.25"})


@pytest.fixture
def env(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, spark_connect: SparkConnectServer,
        postgres: PostgresServer, kafka_broker: KafkaBroker,  # noqa: F811
        bigquery_client: bigquery.Client) -> dict[str, str]:
    database = fresh_database(postgres)
    dataset = f"orders_{tmp_path.name[-8:].replace('-', '_')}"
    bigquery_client.create_dataset(f"{bigquery_client.project}.{dataset}")
    settings = {
        "ONCEFLOW_PIPELINES": "tests.record_pipelines", "ONCEFLOW_MAX_FILES": "1",
        "ORDERS_DIR": str(tmp_path / "orders"), "ORDERS_OUT": str(tmp_path / "out"),
        "ORDERS_DSN": f"postgresql://{database.user}:{database.password}@{database.host}:{database.port}/"
                      f"{database.database}",
        "KAFKA_BOOTSTRAP": kafka_broker.bootstrap, "ORDERS_TOPIC": f"orders-{tmp_path.name[-8:]}",
        "ORDERS_BQ_DATASET": dataset, "ONCEFLOW_BIGQUERY_PROJECT": bigquery_client.project,
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "orders").mkdir()
    (tmp_path / "dagster").mkdir()
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster")):
        pass
    return {**settings, "dagster_home": str(tmp_path / "dagster")}


def finish_unfinished(env: dict[str, str], home: Path) -> None:
    """Report the killed runs failed, as the daemon's `dead_run_sensor` does, then run, through the CLI, the
    finalize run the commit sensor asks for each unfinished sequence."""
    store = CommitStore(open_store(f"{home}/commits"))
    with dg.DagsterInstance.from_config(env["dagster_home"]) as instance:
        for run in instance.get_runs():
            if not run.is_finished:
                assert reap_if_dead(instance, run)
        for seq in store.unfinished():
            request = plan_sequence(store, instance, seq)
            assert isinstance(request, dg.RunRequest), request
            config = Path(env["dagster_home"]) / f"{seq.replace(':', '_')}.json"
            config.write_text(json.dumps(request.run_config))
            done = dagster_cli(["job", "execute", "-m", "onceflow.orchestration.definitions", "-j",
                                request.job_name or "", "-c", str(config)], str(home), None, env["dagster_home"])
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_every_record_reaches_every_sink_once_through_crashes_in_each_sinks_commit(
    env: dict[str, str], home: Path, bigquery_client: bigquery.Client
) -> None:
    directory = Path(env["ORDERS_DIR"])
    files = [
        [order(1), order(2), order(3, qty=0), "not json"],      # o3 is filtered out by the transform
        [order(2), order(4), order(5, shop="south")],             # o2 retried by its producer
        [order(6), order(7), order(1)],
        [order(8)],
        [order(9), order(8)],
    ]
    # The first run dies between the raw commit and staging its publication, with no more data in sight: the
    # sensor asks for a run anyway, which stages the batch (and dies inside PostgreSQL's commit of it).
    (directory / "0.jsonl").write_text("\n".join(files[0]) + "\n")
    first = dagster_micro_batch(str(home), "publish.before_stage", "orders", env["dagster_home"])
    assert first.returncode != 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "a record output has not staged every committed batch" in sensor_wants(home, env["dagster_home"])
    # Then each run takes one batch (one file) and is killed inside a different step of its publication.
    crashes = ["sink.postgres.before_commit", "sink.kafka.before_commit", "commit.after_step#2",
               "sink.bigquery.before_commit", None]
    for index, crash in enumerate(crashes):
        if index:
            (directory / f"{index}.jsonl").write_text("\n".join(files[index]) + "\n")
        run = dagster_micro_batch(str(home), crash, "orders", env["dagster_home"])
        assert (run.returncode == 0) == (crash is None), run.stdout[-3000:] + run.stderr[-3000:]
    finish_unfinished(env, home)

    store = CommitStore(open_store(f"{home}/commits"))
    sequences = [s for s in store.sequences() if s.startswith("orders_clean:")]
    assert sequences == [f"orders_clean:epoch-0:batch-{n:012d}" for n in (1, 2, 3, 4, 5)]
    assert all(store.state(s).status == DONE for s in sequences)
    expected = {f"o{n}" for n in (1, 2, 4, 5, 6, 7, 8, 9)}
    with psycopg.connect(env["ORDERS_DSN"]) as connection:
        upserted = connection.execute("SELECT order_id, shop, total, onceflow_batch FROM orders").fetchall()
        log = connection.execute("SELECT order_id FROM order_log").fetchall()
        markers = connection.execute("SELECT target, rows FROM onceflow_commits ORDER BY commit_id").fetchall()
    assert sorted(r[0] for r in upserted) == sorted(expected)
    assert {r[0]: (r[1], r[2]) for r in upserted}["o5"] == ("south", Decimal("2.50"))
    assert sorted(r[0] for r in log) == sorted(expected)  # appended once each: no batch twice
    assert sorted(markers) == sorted([("public.order_log", n) for n in (2, 2, 2, 1, 1)]
                                     + [("public.orders", n) for n in (2, 2, 2, 1, 1)])
    records = committed_records(env["KAFKA_BOOTSTRAP"], env["ORDERS_TOPIC"])
    assert sorted(key for key, _, _ in records) == sorted(expected)
    assert all(headers["record_id"] == value["record_id"] == key for key, value, headers in records)
    parts = sorted((Path(env["ORDERS_OUT"]) / "orders_clean" / "epoch=0").iterdir())
    assert [p.name for p in parts] == [f"batch={n:012d}.parquet" for n in (1, 2, 3, 4, 5)]
    ids = [i for p in parts for i in pq.read_table(p).column("order_id").to_pylist()]
    assert sorted(ids) == sorted(expected)
    loaded = bigquery_client.query_and_wait(f"SELECT order_id, total FROM `{env['ORDERS_BQ_DATASET']}.orders_clean`")
    assert sorted(row["order_id"] for row in loaded) == sorted(expected)
    assert not open_store(f"{home}/staging").list("records")  # every staged batch let go
    with dg.DagsterInstance.from_config(env["dagster_home"]) as instance:
        published = instance.fetch_materializations(dg.AssetKey("orders_clean"), limit=100).records
    assert sorted(r.asset_materialization.metadata["batch_id"].value for r in published) == [1, 2, 3, 4, 5]

    status = json.loads(onceflow_cli(["status", "--json"]).stdout)["pipelines"][0]["record_outputs"]
    assert [(s["asset"], s["last_published_batch"], s["lag_batches"], s["not_done"]) for s in status] == [
        ("orders_clean", 5, 0, [])]
    verified = onceflow_cli(["verify", "--json"])
    account = json.loads(verified.stdout)["pipelines"][0]["record_outputs"]["orders_clean"]
    assert (verified.returncode, account["published"], account["rows"], account["problems"]) == (0, 5, 8, [])
    with psycopg.connect(env["ORDERS_DSN"]) as connection:  # a sink that lost a batch's commit
        connection.execute("DELETE FROM onceflow_commits WHERE target = 'public.order_log' AND commit_id LIKE '%/2'")
    verified = onceflow_cli(["verify"])
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "orders_clean: MISMATCH: batch 2: done, but postgres:order_log does not hold it" in verified.stdout
