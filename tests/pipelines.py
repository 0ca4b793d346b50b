"""Build a test `events` pipeline on the Pub/Sub emulator, isolated in its own Pub/Sub project."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from onceflow.jobs.declare.declaration import FileSink, Pipeline, WindowedOutput
from onceflow.jobs.declare.sources import PubSubSource
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.pipelines import load_pipelines, resolve
from onceflow.orchestration.pipelines.events import SCHEMA, event_counts
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubClient
from onceflow.resources.settings import load_settings

# Fault injection is a process's own; pyspark marks a process that opened a Spark Connect session: this process's
# state, not a setting.
INHERITED = ("ONCEFLOW_CRASH_AT", "ONCEFLOW_PAUSE_AT", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE",
             "SPARK_LOCAL_REMOTE")
TOPIC, SUBSCRIPTION, TRACKING = "onceflow-events", "onceflow-events-sub", "onceflow-events-tracking"


def new_project() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def builtin(name: str) -> Pipeline:
    """A built-in pipeline as the code location would load it with the current `ONCEFLOW_*` settings."""
    return next(p for p in load_pipelines(load_settings()) if p.name == name)


def events_pipeline(max_messages: int = 500, ack_deadline_s: int = 60, delivery: str = "exactly_once") -> Pipeline:
    """`events` on Pub/Sub with test-sized batches, resolved against the current settings."""
    return resolve(
        Pipeline(
            name="events",
            source=PubSubSource(
                topic=TOPIC,
                subscription=SUBSCRIPTION,
                tracking_subscription=TRACKING,
                id_attribute="event_id",
                timestamp_attribute="event_time",
                max_messages=max_messages,
                max_seconds=10.0,
                ack_deadline_s=ack_deadline_s,
            ),
            schema=SCHEMA,
            delivery=delivery,
            outputs=[
                WindowedOutput(asset="event_counts", window="1m", allowed_lateness="30s", keys=["key"],
                               transform=event_counts, sinks=[FileSink()])
            ],
        ),
        load_settings(),
    )


def setup(project: str, home: str, pipeline: Pipeline) -> tuple[PubSubClient, SourceRuntime]:
    client = PubSubClient(project, load_settings().pubsub_emulator_host)
    source = open_source(pipeline, LakeResource(home=home), lambda: client)
    source.reader.ensure()
    return client, source


def drain(get_spark, source: SourceRuntime, redelivery_wait_s: float = 0.0) -> list:
    """Run micro-batches until the source is empty; optionally wait once for unacked messages to come back."""
    results = []
    waited = False
    while True:
        result = run_micro_batch(get_spark, source)
        if result is not None:
            results.append(result)
            continue
        if waited or redelivery_wait_s <= 0:
            return results
        time.sleep(redelivery_wait_s)
        waited = True


def dagster_env(home: str, crash_at: str | None, dagster_home: str, **settings: str) -> dict[str, str]:
    """The environment of a `dagster` command an operator runs: this process's, with `ONCEFLOW_HOME`, `settings` as
    `ONCEFLOW_<NAME>` variables (`pubsub_project="p"` sets `ONCEFLOW_PUBSUB_PROJECT`), and the instance in
    `dagster_home`."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED}
    env = {**env, "ONCEFLOW_HOME": home, **{f"ONCEFLOW_{k.upper()}": v for k, v in settings.items()}}
    if crash_at:
        env["ONCEFLOW_CRASH_AT"] = crash_at
    return {**env, "DAGSTER_HOME": dagster_home}


def dagster_cli(
    args: list[str], home: str, crash_at: str | None, dagster_home: str | None = None, timeout_s: float = 300,
    **settings: str,
) -> subprocess.CompletedProcess[str]:
    """Run a `dagster` command in its own process, as an operator would, against the instance in `dagster_home`
    (a fresh one when None), for at most `timeout_s` (`dagster_env`)."""
    with tempfile.TemporaryDirectory() as fresh:
        env = dagster_env(home, crash_at, dagster_home or fresh, **settings)
        return subprocess.run(
            [sys.executable, "-m", "dagster", *args], env=env, capture_output=True, text=True, timeout=timeout_s
        )


def micro_batch_started(
    home: str, dagster_home: str, crash_at: str | None = None, pipeline: str = "events", **settings: str
) -> subprocess.Popen[str]:
    """`dagster job execute -j ingest_<pipeline>` started in the background (its output kept in pipes)."""
    args = ["job", "execute", "-m", "onceflow.orchestration.definitions", "-j", f"ingest_{pipeline}"]
    return subprocess.Popen([sys.executable, "-m", "dagster", *args], env=dagster_env(
        home, crash_at, dagster_home, **settings), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def onceflow_cli(args: list[str], timeout_s: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `onceflow <args>` in its own process, as an operator would, with this process's settings and `env`."""
    environment = {**{k: v for k, v in os.environ.items() if k not in INHERITED}, **env}
    return subprocess.run([sys.executable, "-m", "onceflow", *args], env=environment, capture_output=True, text=True,
                          timeout=timeout_s)


def dagster_micro_batch(
    home: str, crash_at: str | None, pipeline: str = "events", dagster_home: str | None = None, **settings: str
) -> subprocess.CompletedProcess[str]:
    """`dagster job execute -j ingest_<pipeline>`."""
    args = ["job", "execute", "-m", "onceflow.orchestration.definitions", "-j", f"ingest_{pipeline}"]
    return dagster_cli(args, home, crash_at, dagster_home, **settings)


def dagster_materialize(
    home: str, partition: str, crash_at: str | None = None, asset: str = "event_counts", dagster_home: str | None = None,
    **settings: str,
) -> subprocess.CompletedProcess[str]:
    """`dagster asset materialize --select <asset> --partition K` (or `--partition-range A...B`)."""
    flag = "--partition-range" if "..." in partition else "--partition"
    return dagster_cli(
        ["asset", "materialize", "-m", "onceflow.orchestration.definitions", "--select", asset, flag, partition],
        home,
        crash_at,
        dagster_home,
        **settings,
    )


def events_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_files: int) -> Path:
    """Point the built-in `events` pipeline at a fresh directory of JSON-lines files, `max_files` per batch."""
    directory = tmp_path / "incoming"
    directory.mkdir()
    monkeypatch.setenv("ONCEFLOW_EVENTS_SOURCE", "files")
    monkeypatch.setenv("ONCEFLOW_EVENTS_DIR", str(directory))
    monkeypatch.setenv("ONCEFLOW_MAX_FILES", str(max_files))
    return directory


def sensor_wants(home: Path, dagster_home: str | None = None, pipeline: Pipeline | None = None) -> str:
    """Why `pipeline`'s (default: the one loaded pipeline's) micro-batch sensor asks for a run now (its skip
    reason when it does not), evaluated against the instance at `dagster_home` (default: an ephemeral one)."""
    import dagster as dg

    from onceflow.orchestration.deployments import LAKE, PUBSUB
    from onceflow.orchestration.sensors.micro_batch import build_micro_batch_sensor
    from onceflow.resources.pubsub import PubSubResource

    if pipeline is None:
        (pipeline,) = load_pipelines(load_settings())
    instance = dg.DagsterInstance.from_config(dagster_home) if dagster_home else dg.DagsterInstance.ephemeral()
    with instance:
        context = dg.build_sensor_context(instance=instance, resources={
            LAKE: LakeResource(home=str(home)), PUBSUB: PubSubResource(project="unused")})
        result = build_micro_batch_sensor(pipeline, idle_tick_s=0)(context)
    if isinstance(result, dg.SkipReason):
        return result.skip_message or ""
    return result.run_requests[0].tags["onceflow/why"]
