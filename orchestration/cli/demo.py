"""`onceflow demo`: the exactly-once story end to end, driven by the real sensors of a real Dagster daemon.

On embedded defaults: Google's Pub/Sub emulator, a warm Spark Connect engine, the BigQuery emulator (when it can
be set up), and a temporary Dagster instance whose `dagster-daemon` runs `events_micro_batch_sensor`,
`event_counts_window_sensor` and `commit_sensor`. A workload is published over about a minute (publisher retries,
out-of-order events, malformed messages, and late events for a window that has already closed); one micro-batch
run's process is killed with SIGKILL in the middle of its batch. When every window is closed and published, the
reconciliation is printed (per window: received = inserted + duplicates + late + dead-lettered; output equals
the expected counts; every event once in the record output's PostgreSQL table, and on Kafka with `--source
kafka`) and the exit status is 0 only if exactly-once held.

`run_streaming` is the same scenario as a function, for the end-to-end test.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.orchestration.checkout import PROJECT_ROOT
from onceflow.orchestration.sensors.runs import run_worker_pid
from onceflow.orchestration.workload import KAFKA_MALFORMED, MALFORMED, Expected, KafkaEventsClient, Publisher
from onceflow.resources.processes import kill_tree

DEMO_SETTINGS = {
    "ONCEFLOW_PUBSUB_PROJECT": "onceflow-demo",
    "ONCEFLOW_MAX_MESSAGES": "2000",
    "ONCEFLOW_MAX_SECONDS": "1",
    "ONCEFLOW_ACK_DEADLINE_S": "30",
    "ONCEFLOW_ALLOWED_LATENESS_S": "10",
    "ONCEFLOW_WATERMARK_BAND_S": "5",
    "ONCEFLOW_WATERMARK_IDLE_S": "10",
    "ONCEFLOW_IDLE_TICK_S": "10",
    "ONCEFLOW_MICRO_BATCH_RUN_S": "40",
    "ONCEFLOW_BIGQUERY_DATASET": "onceflow_demo",
}


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class StreamingResult:
    ok: bool
    windows: list[str]
    expected: Expected
    killed_run: str | None
    latencies: dict[str, float]
    home: Path


def run_streaming(
    duration_s: float = 60.0,
    rate: int = 25,
    timeout_s: float = 600.0,
    keep: bool = False,
    spark_remote: str | None = None,
    profile: str = "local",
    source: str = "pubsub",
) -> StreamingResult:
    """The demo scenario; see the module docstring. Returns its outcome instead of an exit status.

    `spark_remote` is a running Spark Connect server to use instead of starting one; `profile` is a deployment
    profile (`local_stack.PROFILES`: `cluster-gcs` runs on a standalone cluster, the lake on the GCS emulator and
    Dagster on PostgreSQL); `source="kafka"` runs `events` on a Kafka topic of a KRaft broker the stack starts;
    `keep` keeps the onceflow home (`StreamingResult.home`) for inspection.
    """
    from onceflow.jobs.publish.commit_records import DONE
    from onceflow.jobs.publish.commit_store import CommitStore
    from onceflow.jobs.sources.reader import open_source, source_watermark_ms
    from onceflow.jobs.verify.reconcile import render
    from onceflow.orchestration.cli.sink_audit import audit_record_outputs
    from onceflow.orchestration.cli.verify import reconcile_pipeline, reconcile_record_outputs
    from onceflow.orchestration.deployments import LAKE, PUBSUB, resources_for
    from onceflow.orchestration.local_stack import PROFILES, local_stack
    from onceflow.orchestration.pipelines import load_pipelines
    from onceflow.resources.lake import LakeResource
    from onceflow.resources.pubsub import PubSubClient
    from onceflow.resources.settings import load_settings
    from onceflow.resources.spark import build_spark_session

    settings = {**DEMO_SETTINGS, "ONCEFLOW_EVENTS_SOURCE": source}
    records = ("postgres", "kafka") if source == "kafka" else ("postgres",)
    with local_stack(settings, "onceflow-demo-", spark_remote, keep, say, kafka=source == "kafka", records=records,
                     **PROFILES[profile]) as stack:
        instance = stack.instance
        settings = load_settings()
        pipeline = next(p for p in load_pipelines(settings) if p.name == "events")
        output = pipeline.windowed_outputs[0]
        resources = resources_for(settings)
        lake: LakeResource = resources[LAKE]
        client: PubSubClient = resources[PUBSUB].client()
        source = open_source(pipeline, lake, lambda: client)
        spec = pipeline.source
        closes = CloseStore(lake.panes(), output.asset)
        commits = CommitStore(lake.commits())
        checkpoints = source.checkpoints

        def first_closed() -> str | None:
            windows = closes.windows(output.window_s)
            return windows[0].key if windows else None

        if stack.kafka is not None:
            publisher = Publisher(KafkaEventsClient(stack.kafka.bootstrap), spec.topic, duration_s, rate, first_closed,
                                  malformed=KAFKA_MALFORMED)
        else:
            publisher = Publisher(client, spec.topic, duration_s, rate, first_closed, malformed=MALFORMED)
        publisher.start()
        say(f"publishing {rate} events/s for {duration_s:.0f}s, with publisher retries, malformed and late events")

        killed: str | None = None
        deadline = time.monotonic() + timeout_s
        last_report = 0.0
        while time.monotonic() < deadline:
            if stack.daemon.poll() is not None:
                raise RuntimeError(f"dagster-daemon exited ({stack.daemon.returncode}):\n{stack.daemon_log()}")
            checkpoint = checkpoints.load()
            if killed is None:
                killed = _kill_mid_batch(instance, checkpoints, checkpoint.committed_batch)
                if killed:
                    say(f"SIGKILLed run {killed[:8]} in the middle of batch {checkpoint.next_batch}")
            windows = sorted(publisher.expected.on_time)
            done = [w for w in windows if _published(closes, commits, Window.from_partition_key(w, 60), DONE, output.asset)]
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                watermark = source_watermark_ms(checkpoint)
                lag = f"{time.time() - watermark / 1000:.0f}s" if watermark else "-"
                say(f"batches committed {checkpoint.committed_batch}, watermark lag {lag}, windows closed "
                    f"{len(closes.windows(output.window_s))}, published {len(done)}/{len(windows)}, "
                    f"commit sequences pending {len(commits.unfinished())}")
            if publisher.error is not None:
                raise publisher.error
            if (publisher.done.is_set() and windows and len(done) == len(windows) and not commits.unfinished()
                    and not source.reader.has_data(checkpoint)):
                break
            time.sleep(1)
        else:
            raise TimeoutError(f"not every window was closed and published within {timeout_s:.0f}s")

        say("every window is closed and published; reconciling")
        spark = build_spark_session(remote=stack.spark_remote)
        source_facts, outputs_facts = reconcile_pipeline(spark, pipeline, lake)
        rows = outputs_facts[output.asset]
        print(render(rows), flush=True)
        expected = publisher.expected
        outputs = _window_outputs(spark, lake.table_path(output.table))
        checks = {
            "nothing lost, nothing twice (landed IDs against raw and dead letters, read with delta-rs)":
                source_facts.ok,
            "every window balances (received = inserted + duplicates + late + dead-lettered)":
                all(r.balanced for r in rows),
            "every closed window's output is its pinned input's transform, published exactly as the table holds it":
                all(r.ok for r in rows),
            "every window's output equals the expected counts and sums, per key":
                all(outputs.get(w, {}) == expected.counts(w) for w in expected.on_time),
            # Late events go out only once a window has closed: none sent would make this check pass vacuously.
            "late events were sent, counted late, not in the output": bool(expected.late)
                and all(next((r.late for r in rows if r.window == w), 0) == n for w, n in expected.late.items()),
            "all messages received (redeliveries may add to them)":
                sum(r.received for r in rows) >= expected.messages,
            "a run was killed mid-batch": killed is not None,
            **audit_record_outputs(pipeline, lake, reconcile_record_outputs(pipeline, lake)),
        }
        for name, held in checks.items():
            print(f"  [{'ok' if held else 'FAILED'}] {name}", flush=True)
        latencies = _latencies(instance, pipeline.name, output.asset, expected, closes, commits)
        for name, value in latencies.items():
            print(f"  {name}: {value}" if name.endswith("(count)") else f"  {name}: {value:.1f}s", flush=True)
        _record_latencies(latencies, {"profile": profile, "engine_path": stack.engine_path,
                                      "source": pipeline.source.kind})
        ok = all(checks.values())
        print(f"\nexactly-once {'held' if ok else 'VIOLATED'} (engine path: {stack.engine_path}, source: "
              f"{pipeline.source.kind})", flush=True)
        return StreamingResult(ok, sorted(expected.on_time), expected, killed, latencies, stack.home)


def _kill_mid_batch(instance, checkpoints, committed: int) -> str | None:
    """SIGKILL the running micro-batch once it has planned (landed) its batch but not committed it."""
    import dagster as dg

    if checkpoints.get_plan(committed + 1) is None:
        return None
    runs = instance.get_runs(filters=dg.RunsFilter(job_name="ingest_events", statuses=[dg.DagsterRunStatus.STARTED]))
    for run in runs:
        worker = run_worker_pid(instance, run.run_id)
        if worker is None:
            continue
        kill_tree(worker)
        return run.run_id
    return None


def _published(closes, commits, window, done: str, asset: str) -> bool:
    from onceflow.jobs.publish.sequence import sequence_id

    close = closes.latest(window)
    if close is None:
        return False
    seq = sequence_id(asset, window.key, close.pane)
    return commits.get(seq) is not None and commits.state(seq).status == done


def _window_outputs(spark, windows_path: str) -> dict[str, dict[str, tuple[int, Decimal]]]:
    outputs: dict[str, dict[str, tuple[int, Decimal]]] = {}
    for row in spark.read.format("delta").load(windows_path).collect():
        window = Window.at(int(row["window_start"].timestamp() * 1000), 60).key
        outputs.setdefault(window, {})[row["key"]] = (int(row["count"]), Decimal(row["sum_value"]))
    return outputs


def _latencies(instance, name: str, asset: str, expected: Expected, closes, commits) -> dict[str, float]:
    """Medians: publish → the event's window published; micro-batch run requested (sensor tick) → committed."""
    import dagster as dg

    from onceflow.jobs.publish.sequence import sequence_id
    done_ms: dict[str, int] = {}
    end_to_close, close_to_done = [], []
    for window in expected.on_time:
        close = closes.latest(Window.from_partition_key(window, 60))
        if close is not None:
            state = commits.state(sequence_id(asset, window, close.pane))
            if state.updated_at_ms is not None:
                done_ms[window] = state.updated_at_ms
                end_to_close.append((close.closed_at_ms - Window.from_partition_key(window, 60).end_ms) / 1000)
                close_to_done.append((state.updated_at_ms - close.closed_at_ms) / 1000)
    to_output = [
        (done_ms[w] - expected.publish_ms[e]) / 1000
        for w, events in expected.on_time.items() if w in done_ms for e in events
    ]
    records = instance.get_run_records(filters=dg.RunsFilter(job_name=f"ingest_{name}"))
    # Every committed batch records when it was requested and by what (`requested_by`: the run's launch, the handover
    # from the run before it, or the warm run's own poll) and when it committed; idle polls record nothing.
    by: dict[str, list[float]] = {"launch": [], "handover": [], "poll": []}
    for r in records:
        for event in instance.all_logs(r.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
            metadata = event.asset_materialization.metadata if event.asset_materialization else {}
            if {"requested_at_ms", "requested_by", "committed_at_ms"} <= metadata.keys():
                seconds = (metadata["committed_at_ms"].value - metadata["requested_at_ms"].value) / 1000
                by[metadata["requested_by"].value].append(seconds)
    queued = [r.start_time - r.create_timestamp.timestamp() for r in records if r.start_time]
    result = {}
    if to_output:
        result["publish -> window output committed (median over events)"] = statistics.median(to_output)
        result["  window end -> window closed (median over windows)"] = statistics.median(end_to_close)
        result["  window closed -> published (median over windows)"] = statistics.median(close_to_done)
    if any(by.values()):
        result["batch requested -> micro-batch committed (median over batches)"] = statistics.median(
            [s for seconds in by.values() for s in seconds])
    if by["launch"]:
        result["  first batch of a launched run: sensor tick -> committed (median over runs)"] = statistics.median(
            by["launch"])
        result["  of which requested -> run process started"] = statistics.median(queued)
    if by["handover"]:
        result["  first batch of a relayed run: the run before stops -> committed (median over runs)"] = (
            statistics.median(by["handover"]))
    if by["poll"]:
        result["  later batches of a run: its own poll -> committed (median over batches)"] = statistics.median(
            by["poll"])
    for kind, seconds in by.items():
        result[f"  batches requested by {kind} (count)"] = len(seconds)
    return result


DEMO_LATENCY = PROJECT_ROOT / "bench" / "results" / "demo_latency.json"


def _record_latencies(latencies: dict[str, float], ran: dict[str, str]) -> None:
    """Leave the demo's latencies where `make bench` reports them (tick -> commit needs the daemon), with what ran
    (`ran`: the profile, engine path and source)."""
    DEMO_LATENCY.parent.mkdir(parents=True, exist_ok=True)
    DEMO_LATENCY.write_text(json.dumps({"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **ran,
                                        "settings": DEMO_SETTINGS, "latencies_s": latencies}, indent=2))


def run_demo(profile: str = "local", source: str = "pubsub") -> int:
    try:
        result = run_streaming(profile=profile, source=source)
    except (TimeoutError, RuntimeError) as error:
        say(f"FAILED: {error}")
        return 1
    return 0 if result.ok else 1
