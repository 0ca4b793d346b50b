"""onceflow on a Spark standalone cluster (a master and two workers on 127.0.0.1), on both engine paths.

Classic: every Dagster run's session has `ONCEFLOW_SPARK_MASTER=spark://...`. Connect: the runs are clients of
the warm engine `onceflow engine --master spark://...` starts, a Spark Connect server whose master is the cluster. Either way the runs ingest files (split by Spark inside each file,
so executors compute line offsets from the files' URIs), close windows and publish them; the tables are read back
with delta-rs and the cluster's own records show that its executors, on both workers, ran the tasks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.panes import Window
from onceflow.orchestration.workload import Event, expected_raw
from onceflow.resources.lake import LakeResource
from onceflow.resources.processes import stop_process_group
from onceflow.resources.settings import SettingsError, load_settings
from onceflow.resources.spark import DELTA_CONF, SMALL_MACHINE_CONF, engine_conf
from onceflow.resources.spark_cluster import SparkCluster
from tests.delta_reader import read_rows
from tests.pipelines import builtin, dagster_materialize, dagster_micro_batch
from tests.test_window_asset import expected_table, published_rows, table_rows
from tests.test_windows import WINDOW_ROWS, five_window_workload, minute_base

pytestmark = pytest.mark.cluster
RAW = ["record_id", "event_time", "key", "value"]
# A user's conf for a small cluster (few shuffle partitions for small batches) and splits of about 1 KB: Spark
# starts most splits inside a file, where the executor finds the next line from the file's URI itself.
USER_CONF = {"spark.sql.files.maxPartitionBytes": "1024", "spark.sql.files.openCostInBytes": "0",
             "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"}
DISCOVERY = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def test_small_machine_tuning_is_for_local_masters_and_spark_conf_is_checked_at_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONCEFLOW_SPARK_MASTER", "spark://127.0.0.1:7077")
    monkeypatch.setenv("ONCEFLOW_SPARK_CONF", '{"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": 64}')
    monkeypatch.setenv("ONCEFLOW_SPARK_JARS", "/opt/jars/a.jar, gs://bucket/b.jar")
    settings = load_settings()
    assert (settings.spark_conf, settings.spark_jars) == (
        {"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "64"}, ("/opt/jars/a.jar", "gs://bucket/b.jar"))

    cluster = engine_conf(settings.spark_master, settings.spark_conf)
    local = engine_conf("local[2]")
    assert not {k for k in SMALL_MACHINE_CONF if k != "spark.sql.shuffle.partitions"} & cluster.keys()
    assert SMALL_MACHINE_CONF.items() <= local.items()
    for conf in (cluster, local):  # correctness settings hold everywhere
        assert DELTA_CONF.items() <= conf.items() and conf["spark.sql.session.timeZone"] == "UTC"
    assert cluster["spark.sql.shuffle.partitions"] == "64" and cluster["spark.executor.memory"] == "512m"

    for bad, says in [
        ('{"spark.executor.memory": ', "not a JSON object"),
        ('["spark.executor.memory"]', "expected a JSON object"),
        ('{"executor.memory": "4g"}', "is not a Spark setting"),
        ('{"spark.jars": "/x.jar"}', "comes from ONCEFLOW_SPARK_JARS"),
        ('{"spark.executor.memory": {"size": 4}}', "a value is a string, a number or a boolean"),
    ]:
        monkeypatch.setenv("ONCEFLOW_SPARK_CONF", bad)
        with pytest.raises(SettingsError, match=f"^ONCEFLOW_SPARK_CONF=.*{says}"):
            load_settings()
    monkeypatch.delenv("ONCEFLOW_SPARK_CONF")
    monkeypatch.setenv("ONCEFLOW_SPARK_MASTER", "spark//127.0.0.1:7077")
    with pytest.raises(SettingsError, match=r"^ONCEFLOW_SPARK_MASTER='spark//127\.0\.0\.1:7077': .*spark://host:port"):
        load_settings()


@pytest.fixture
def cluster_engine(spark_cluster: SparkCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """`onceflow engine --master <the cluster>` with the user's Spark conf, as an operator starts it; yields the
    `sc://` URL it prints. The engine holds every worker's core while it runs, so it runs only for its test."""
    monkeypatch.setenv("ONCEFLOW_SPARK_CONF", json.dumps(USER_CONF))
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    command = subprocess.Popen(
        [str(Path(sys.executable).parent / "onceflow"), "engine", "--master", spark_cluster.master_url],
        stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        assert command.stdout is not None
        lines = iter(command.stdout.readline, "")
        url = next((line.strip().partition("=")[2] for line in lines if line.startswith("ONCEFLOW_SPARK_REMOTE=")), None)
        assert url is not None and url.startswith("sc://127.0.0.1:"), f"the engine exited ({command.wait()})"
        yield url
        os.killpg(command.pid, signal.SIGTERM)
        assert command.wait(timeout=120) == 0
        port = int(url.rpartition(":")[2])
        with pytest.raises(OSError):  # the engine stopped its server
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        stop_process_group(command)


def workload(directory: Path) -> tuple[int, list[Event], list[tuple[str, str]]]:
    """Five windows of events in two files (the second repeats five of the first's), and the `source_position`
    each record's first occurrence has: `<file>:<byte offset>`."""
    base = minute_base()
    on_time, _, _ = five_window_workload(base)
    files = {"a.jsonl": on_time[:40], "b.jsonl": on_time[40:] + on_time[:5]}
    positions: dict[str, str] = {}
    directory.mkdir(parents=True)
    for name, events in files.items():
        offset = 0
        for event in events:
            positions.setdefault(event.event_id, f"{name}:{offset}")
            offset += len(event.json_line()) + 1
        (directory / name).write_text("".join(e.json_line() + "\n" for e in events))
    return base, on_time, sorted(positions.items())


def finished_tasks(cluster: SparkCluster, apps: set[str]) -> list[int]:
    """How many tasks the executors of `apps` finished on each worker, from the executors' own logs."""
    return [
        sum(log.read_text(errors="replace").count("Executor: Finished task") for app in apps
            for log in (work / app).glob("*/stderr"))
        for work in cluster.worker_dirs()
    ]


def engine_settings(client: str) -> dict[str, str]:
    """Settings a Spark Connect client sees on the server, asked from a process of its own (this one may hold a
    classic session)."""
    keys = ["spark.master", DISCOVERY, "spark.sql.files.maxPartitionBytes", "spark.sql.session.timeZone"]
    code = ("import json, sys; from onceflow.resources.spark import build_spark_session; s = build_spark_session(remote=sys.argv[1]); "
            f"print(json.dumps({{k: s.conf.get(k) for k in {keys!r}}})); s.stop()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}
    out = subprocess.run([sys.executable, "-c", code, client], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", ["classic", "connect"])
def test_ingest_window_publish_on_a_two_worker_cluster(
    path: str, spark_cluster: SparkCluster, request: pytest.FixtureRequest, tmp_path: Path, home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    before = {app["id"] for app in spark_cluster.status()["completedapps"] + spark_cluster.status()["activeapps"]}
    if path == "connect":
        url: str = request.getfixturevalue("cluster_engine")
        engine = {"spark_remote": url}
        seen = engine_settings(url)
        # The server drives the cluster with the user's conf and without the small-machine tuning.
        assert seen == {"spark.master": spark_cluster.master_url, DISCOVERY: "10000",
                        "spark.sql.files.maxPartitionBytes": "1024", "spark.sql.session.timeZone": "UTC"}
    else:
        engine = {"spark_remote": "", "spark_master": spark_cluster.master_url, "spark_conf": json.dumps(USER_CONF)}
    directory = tmp_path / "incoming"
    base, on_time, positions = workload(directory)
    # Every record also to the record output `events_clean`, as Parquet files: its publication on the cluster too.
    settings = {"events_source": "files", "events_dir": str(directory), "events_records": "files", **engine}
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()

    ingest = dagster_micro_batch(str(home), None, dagster_home=str(dagster_home), timeout_s=900, **settings)
    assert ingest.returncode == 0, ingest.stderr[-3000:]
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(directory))
    pipeline = builtin("events")
    lake = LakeResource(home=str(home))
    watermark = source_watermark_ms(open_source(pipeline, lake).checkpoints.load())
    assert watermark is not None
    windows = [Window(base + w * 60_000, base + (w + 1) * 60_000) for w in range(5)]
    closed = [w.end_ms + pipeline.outputs[0].allowed_lateness_s * 1000 <= watermark for w in windows]
    assert closed[0] and not closed[-1]
    window = dagster_materialize(str(home), f"{windows[0].key}...{windows[2].key}", dagster_home=str(dagster_home),
                                 timeout_s=900, **settings)
    assert window.returncode == 0, window.stderr[-3000:]

    raw = lake.table_path(pipeline.raw_table)
    assert read_rows(raw, RAW) == expected_raw(on_time)
    assert read_rows(raw, ["record_id", "source_position"]) == positions  # offsets exact across split files
    published = sorted((home / "published" / "events_clean" / "epoch=0").glob("batch=*.parquet"))
    assert published and sorted(i for p in published for i in pq.read_table(p).column("record_id").to_pylist()) == \
        sorted(r[0] for r in read_rows(raw, ["record_id"]))  # each raw record once
    windows_path = lake.table_path(pipeline.outputs[0].table)
    assert read_rows(windows_path, WINDOW_ROWS) == expected_table(base, on_time, closed, range(3))
    for w, is_closed in zip(windows, closed, strict=True):
        assert published_rows(home, w) == (table_rows(windows_path, w) if is_closed and w in windows[:3] else [])
    assert all(closed[:3]) and all(published_rows(home, w) for w in windows[:3])

    # The cluster did the work: its applications for these runs had executors on both workers, which ran tasks.
    status = spark_cluster.status()
    apps = {app["id"]: app for app in status["completedapps"] + status["activeapps"] if app["id"] not in before}
    names = sorted(app["name"] for app in apps.values())
    assert names == (["onceflow", "onceflow"] if path == "classic" else ["onceflow-spark-connect"])
    assert status["aliveworkers"] == 2 and all(app["cores"] in (0, 2) for app in apps.values())
    assert all(tasks > 0 for tasks in finished_tasks(spark_cluster, set(apps))), finished_tasks(spark_cluster, set(apps))
