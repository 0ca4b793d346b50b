"""Build a test `events` pipeline on the Pub/Sub emulator, isolated in its own Pub/Sub project."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid

from jobs.micro_batch import SourceHandles, run_micro_batch, source_handles
from jobs.pipeline import Pipeline, PubSubSourceSpec
from resources.lake import LakeResource
from resources.pubsub import PubSubClient

TOPIC, SUBSCRIPTION, TRACKING = "onceflow-events", "onceflow-events-sub", "onceflow-events-tracking"


def new_project() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def events_pipeline(max_messages: int = 500, ack_deadline_s: int = 60, delivery: str = "exactly_once") -> Pipeline:
    return Pipeline(
        name="events",
        source=PubSubSourceSpec(
            topic=TOPIC,
            subscription=SUBSCRIPTION,
            tracking_subscription=TRACKING,
            id_attribute="event_id",
            timestamp_attribute="event_time",
            max_messages=max_messages,
            max_seconds=10.0,
            ack_deadline_s=ack_deadline_s,
        ),
        delivery=delivery,  # type: ignore[arg-type]
    )


def setup(project: str, home: str, pipeline: Pipeline) -> tuple[PubSubClient, SourceHandles]:
    client = PubSubClient(project)
    spec = pipeline.source
    assert isinstance(spec, PubSubSourceSpec)
    client.ensure_subscriptions(spec.topic, [spec.subscription, spec.tracking_subscription], spec.ack_deadline_s)
    return client, source_handles(pipeline, LakeResource(home=home), client)


def drain(get_spark, pipeline: Pipeline, handles: SourceHandles, redelivery_wait_s: float = 0.0) -> list:
    """Run micro-batches until the source is empty; optionally wait once for unacked messages to come back."""
    results = []
    waited = False
    while True:
        result = run_micro_batch(get_spark, pipeline, handles)
        if result is not None:
            results.append(result)
            continue
        if waited or redelivery_wait_s <= 0:
            return results
        time.sleep(redelivery_wait_s)
        waited = True


def dagster_cli(args: list[str], home: str, crash_at: str | None, **settings: str) -> subprocess.CompletedProcess[str]:
    """Run a `dagster` command in its own process against a fresh instance, as an operator would.

    `settings` become `ONCEFLOW_<NAME>` variables (`pubsub_project="p"` sets `ONCEFLOW_PUBSUB_PROJECT`).
    """
    env = {**os.environ, "ONCEFLOW_HOME": home, **{f"ONCEFLOW_{k.upper()}": v for k, v in settings.items()}}
    # pyspark marks a process that opened a Spark Connect session; that is this process's state, not a setting.
    for inherited in ("ONCEFLOW_CRASH_AT", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        env.pop(inherited, None)
    if crash_at:
        env["ONCEFLOW_CRASH_AT"] = crash_at
    with tempfile.TemporaryDirectory() as dagster_home:
        env["DAGSTER_HOME"] = dagster_home
        return subprocess.run(
            [sys.executable, "-m", "dagster", *args], env=env, capture_output=True, text=True, timeout=300
        )


def dagster_micro_batch(home: str, crash_at: str | None, **settings: str) -> subprocess.CompletedProcess[str]:
    """`dagster job execute -j ingest_events`."""
    return dagster_cli(["job", "execute", "-m", "orchestration.definitions", "-j", "ingest_events"], home, crash_at, **settings)


def dagster_materialize(
    home: str, partition: str, crash_at: str | None = None, **settings: str
) -> subprocess.CompletedProcess[str]:
    """`dagster asset materialize --select event_counts --partition K` (or `--partition-range A...B`)."""
    flag = "--partition-range" if "..." in partition else "--partition"
    return dagster_cli(
        ["asset", "materialize", "-m", "orchestration.definitions", "--select", "event_counts", flag, partition],
        home,
        crash_at,
        **settings,
    )
