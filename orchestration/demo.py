"""`onceflow demo`: the exactly-once story on embedded defaults, start to finish in one command.

It starts Google's Pub/Sub emulator and a temporary Dagster instance, publishes a workload with publisher retries
and malformed messages, runs the `ingest_events` job in its own process with a crash injected right after a
batch's Delta commit, then lets Dagster run micro-batches until the subscription is drained, and reconciles:
every published message is inserted, a duplicate or dead-lettered, and the raw table holds exactly the expected
records. The exit status is 0 only if exactly-once held.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from orchestration.workload import (
    MALFORMED,
    expected_raw,
    make_events,
    publish_events,
    with_publisher_retries,
)
from resources.pubsub_emulator import start_pubsub_emulator

PROJECT_ROOT = Path(__file__).resolve().parent.parent
START_MS = 1_763_719_200_000  # 2025-11-21T10:00:00Z
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_demo() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-demo-"))
    os.environ.update(
        ONCEFLOW_HOME=str(workdir / "home"),
        DAGSTER_HOME=str(workdir / "dagster"),
        ONCEFLOW_PUBSUB_PROJECT="onceflow-demo",
        ONCEFLOW_MAX_MESSAGES="400",
        ONCEFLOW_ACK_DEADLINE_S="10",
    )
    os.environ.pop("ONCEFLOW_CRASH_AT", None)
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True)
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml")
    say("starting the Pub/Sub emulator")
    emulator = start_pubsub_emulator()
    os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
    try:
        return _run(workdir)
    finally:
        emulator.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _run(workdir: Path) -> int:
    import dagster as dg

    from jobs.micro_batch import source_handles
    from orchestration.definitions import defs
    from orchestration.pipelines import PIPELINES
    from resources.lake import LakeResource
    from resources.pubsub import PubSubClient
    from resources.spark import SparkResource

    pipeline = PIPELINES[0]
    client = PubSubClient(os.environ["ONCEFLOW_PUBSUB_PROJECT"])
    spec = pipeline.source
    client.ensure_subscriptions(spec.topic, [spec.subscription, spec.tracking_subscription])  # type: ignore[union-attr]

    events = make_events(1500, START_MS, 5 * 60_000, seed=1)
    stream = with_publisher_retries(events, 0.10)
    publish_events(client, spec.topic, stream)  # type: ignore[union-attr]
    client.publish(spec.topic, [(data, attrs) for _, data, attrs in MALFORMED])  # type: ignore[union-attr]
    published = len(stream) + len(MALFORMED)
    say(f"published {published} messages: {len(events)} events, {len(stream) - len(events)} publisher retries, "
        f"{len(MALFORMED)} malformed")

    say("micro-batch 1 runs in its own process and is killed right after its Delta commit (ingest.after_merge)")
    crashed = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "orchestration.definitions", "-j", "ingest_events"],
        env={**os.environ, "ONCEFLOW_CRASH_AT": "ingest.after_merge"},
        capture_output=True,
        text=True,
        check=False,
    )
    if "crash injected at ingest.after_merge" not in crashed.stderr + crashed.stdout:
        say("the crash was not injected:\n" + crashed.stderr[-2000:])
        return 1
    say("the process died at ingest.after_merge; Dagster now runs micro-batches until the subscription is drained")

    job = defs.get_job_def("ingest_events")
    instance = dg.DagsterInstance.get()
    batches = []
    while True:
        result = job.execute_in_process(instance=instance, run_config=QUIET)
        materializations = result.asset_materializations_for_node("micro_batch_events")
        if not materializations:
            break
        meta = {k: v.value for k, v in materializations[0].metadata.items()}
        batches.append(meta)
        say(
            f"batch {meta['batch_id']}: read {meta['records_read']}, inserted {meta['inserted']}, duplicates "
            f"{meta['duplicates_in_batch'] + meta['duplicates_already_committed']}, dead-lettered "
            f"{meta['dead_lettered']}" + ("  (replayed: already committed, nothing written)"
                                          if meta["replayed_batch_noop"] else "")
        )

    lake = LakeResource.from_env()
    handles = source_handles(pipeline, lake, client)
    totals = handles.checkpoints.load().totals
    spark = SparkResource.from_env().get_session()
    raw = spark.read.format("delta").load(handles.raw_path)
    rows = sorted(
        (r["record_id"], r["event_time"], r["key"], r["value"])
        for r in raw.select("record_id", "event_time", "key", "value").collect()
    )
    dead = Counter(r["reason"] for r in spark.read.format("delta").load(handles.dead_letter_path).collect())
    expected_rows = [(i, t.replace(tzinfo=None), k, v) for i, t, k, v in expected_raw(events)]
    print()
    print("reconciliation")
    print(f"  published                 {published}")
    print(f"  received                  {totals['received']}")
    print(f"  inserted                  {totals['inserted']}")
    print(f"  duplicates                {totals['duplicates']}")
    print(f"  dead-lettered             {totals['dead_lettered']}  {dict(sorted(dead.items()))}")
    print(f"  raw rows                  {len(rows)} (expected {len(expected_rows)})")
    print("\n  raw/events per key         count        sum(value)")
    for key in sorted({k for _, _, k, _ in rows}):
        values = [v for _, _, k, v in rows if k == key]
        print(f"    {key:<24}{len(values):>7}{sum(values):>18}")
    checks = {
        "received = inserted + duplicates + dead-lettered": totals["received"]
        == totals["inserted"] + totals["duplicates"] + totals["dead_lettered"],
        "every published message received once": totals["received"] == published,
        "raw table equals the expected records": rows == expected_rows,
        "every malformed message dead-lettered with its reason": dead == Counter(r for r, _, _ in MALFORMED),
        "the crashed batch was replayed as a no-op": bool(batches) and bool(batches[0]["replayed_batch_noop"]),
    }
    print()
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")
    held = all(checks.values())
    print(f"\nexactly-once {'held' if held else 'VIOLATED'}")
    return 0 if held else 1
