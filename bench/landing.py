"""Pub/Sub landing throughput on the emulator: publish -> landed, one pull at a time against several in flight
(docs/design.md section 10: "Pub/Sub landing >= 4x its 5,610 records/s of 2026-11-24").

Google's Pub/Sub emulator is started as the project starts it, each run in a Pub/Sub project and home of its own,
with the built-in `events` pipeline's declaration (batch bounds from the settings). A run publishes a backlog of
`--landing-events` events (not timed), then times what a micro-batch does before Spark until every event is
landed: drain the tracking subscription and persist its samples, pull the batch, write its plan and its landing
file, ack (`PubSubReader.before_batch` + `next_plan`); each landed batch is marked committed without ingest.
`records_per_s` = records landed / those seconds. The modes run alternately, `--landing-rounds` rounds after a
discarded warm-up: `single_pull` (`pull_streams=1`: one synchronous pull at a time, as before this bench existed)
and `parallel_pulls` (`--landing-streams` pulls in flight). Every run's landing files are read back: the event
ids landed must be exactly those published (a message landed twice is counted in `landed_twice`; ingest would
drop it as a duplicate). Last, `emulator_ceiling`: the same backlog pulled and acked from a base and a tracking
subscription by two processes doing nothing else with it, the most any landing could reach on this machine.

The 2026-11-24 figure (5,610 records/s) was `latency`'s drain, which also ingests into the raw table; both are
reported, with the ratio of each mode to it and of the two modes measured side by side here.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.datasets import BenchmarkError
from onceflow.jobs.declare.sources import PubSubSource
from onceflow.jobs.sources.checkpoint import SourceCheckpoint
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.pipelines import resolve
from onceflow.orchestration.pipelines.events import events_pipeline
from onceflow.orchestration.workload import make_events
from onceflow.resources.emulators.pubsub import PubSubEmulator, start_pubsub_emulator
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubClient
from onceflow.resources.settings import load_settings

BASELINE_RECORDS_PER_S = 5_610.0  # latency's drain on 2026-11-24 (docs/design.md section 10)
EVENTS = 50_000
ROUNDS = 2
WAIT_S = 300.0  # a backlog not landed by then is a failure, not a figure


def publish_backlog(client: PubSubClient, topic: str, count: int, seed: int) -> set[str]:
    """Publish `count` events in requests of 1,000 (the batching publisher sends 100 at a time); their ids."""
    events = make_events(count, int(time.time() * 1000) - 60_000, 60_000, seed=seed, prefix=f"l{seed}-")
    path = client.topic_path(topic)
    for start in range(0, count, 1_000):
        chunk = [{"data": e.data, "attributes": e.attributes(False)} for e in events[start : start + 1_000]]
        client.publisher.api.publish(request={"topic": path, "messages": chunk})
    return {e.event_id for e in events}


def _pull_and_ack(host: str, project: str, subscription: str, target: int, streams: int, ready: Any, go: Any,
                  out: Any) -> None:
    """In a process of its own: pull and ack `target` messages of `subscription` with `streams` pulls in flight,
    doing nothing else with them; puts the seconds it took from `go`."""
    client = PubSubClient(project, host)
    path, lock, acked = client.subscription_path(subscription), threading.Lock(), [0]

    def stream() -> None:
        while True:
            with lock:
                if acked[0] >= target:
                    return
            response = client.subscriber.pull(request={"subscription": path, "max_messages": 1000}, timeout=2.0,
                                              retry=None)
            ack_ids = [r.ack_id for r in type(response).pb(response).received_messages]
            if ack_ids:
                client.subscriber.acknowledge(request={"subscription": path, "ack_ids": ack_ids})
                with lock:
                    acked[0] += len(ack_ids)

    ready.set()
    go.wait()
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(lambda _: stream(), range(streams)))
    out.put(time.perf_counter() - start)


def emulator_ceiling(emulator: PubSubEmulator, events: int, streams: int) -> dict[str, Any]:
    """What the emulator itself serves here: a published backlog pulled and acked from a base and a tracking
    subscription at once (a process each, `streams` pulls in flight each), as a landing must, with nothing else
    done with the messages: no landing can be faster on this machine."""
    client = PubSubClient(f"bench-{uuid.uuid4().hex[:10]}", emulator.host)
    client.ensure_subscriptions("ceiling", ["ceiling-base", "ceiling-tracking"])
    publish_backlog(client, "ceiling", events, seed=99)
    spawn = multiprocessing.get_context("spawn")  # gRPC channels do not survive a fork
    go, out = spawn.Event(), spawn.Queue()
    workers = [(spawn.Process(target=_pull_and_ack, args=(emulator.host, client.project, sub, events, streams,
                                                          ready, go, out)), ready)
               for sub, ready in (("ceiling-base", spawn.Event()), ("ceiling-tracking", spawn.Event()))]
    for process, ready in workers:
        process.start()
        ready.wait(120)
    go.set()
    seconds = max(out.get(timeout=WAIT_S) for _ in workers)
    for process, _ in workers:
        process.join()
    return {"records": events, "seconds": seconds, "records_per_s": events / seconds, "streams": streams}


def land_all(source: SourceRuntime, records: int) -> tuple[int, float]:
    """Land batches until `records` records are landed; the batches and the seconds it took."""
    reader, landed, batches = source.reader, 0, 0
    start = time.perf_counter()
    while landed < records:
        if time.perf_counter() - start > WAIT_S:
            raise BenchmarkError(f"landing: {landed} of {records} records landed after {WAIT_S:.0f} s")
        reader.before_batch(int(time.time() * 1000))
        plan = reader.next_plan(source.checkpoints.load(), None)
        if plan is None:
            continue
        landed += reader.landed_count(plan)
        batches += 1

        def committed(checkpoint: SourceCheckpoint, batch: int = plan.batch_id) -> SourceCheckpoint:
            checkpoint.committed_batch = batch
            return checkpoint

        source.checkpoints.update(committed)
    return batches, time.perf_counter() - start


def run_once(emulator: PubSubEmulator, home: Path, streams: int, events: int, seed: int) -> dict[str, Any]:
    """One checked run: a fresh project and home, a published backlog, landed with `streams` pulls in flight."""
    settings = load_settings().model_copy(update={"events_source": "pubsub", "delivery": "exactly_once"})
    pipeline = resolve(events_pipeline(settings), settings)
    assert isinstance(pipeline.source, PubSubSource)
    pipeline = dataclasses.replace(pipeline, source=dataclasses.replace(pipeline.source, pull_streams=streams))
    client = PubSubClient(f"bench-{uuid.uuid4().hex[:10]}", emulator.host)
    source = open_source(pipeline, LakeResource(home=str(home)), lambda: client)
    source.reader.ensure()
    published = publish_backlog(client, pipeline.source.topic, events, seed)
    batches, seconds = land_all(source, events)
    ids: Counter[str] = Counter()
    for batch in range(1, batches + 1):
        plan = source.checkpoints.get_plan(batch)
        assert plan is not None
        ids.update(r.attributes["event_id"] for r in source.reader.landed_rows(plan) if r.attributes)
    if set(ids) != published:
        raise BenchmarkError(f"landing ({streams} streams): {len(published - set(ids))} events not landed, "
                             f"{len(set(ids) - published)} landed that were not published")
    records = sum(ids.values())
    return {"streams": streams, "records": records, "seconds": seconds, "batches": batches,
            "records_per_s": records / seconds, "landed_twice": records - len(ids)}


def landing(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-ready result (see the module docstring)."""
    events: int = getattr(args, "landing_events", None) or EVENTS
    rounds: int = getattr(args, "landing_rounds", None) or ROUNDS
    streams: int = getattr(args, "landing_streams", None) or load_settings().pull_streams
    modes = {"single_pull": 1, "parallel_pulls": streams}
    emulator = start_pubsub_emulator(timeout_s=120.0)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-landing-") as tmp:
            for round_no in range(rounds + 1):
                order = list(modes) if round_no % 2 else list(modes)[::-1]
                for mode in order:
                    size = events if round_no else min(events, 10_000)
                    run = run_once(emulator, Path(tmp) / f"{mode}-{round_no}", modes[mode], size, seed=round_no)
                    print(f"landing round {round_no}{' (warm-up, discarded)' if not round_no else ''} {mode}: "
                          f"{run['records']} records in {run['seconds']:.2f} s ({run['batches']} batches), "
                          f"{run['records_per_s']:,.0f} records/s, landed twice {run['landed_twice']}", flush=True)
                    if round_no:
                        runs[mode].append(run)
        ceiling = emulator_ceiling(emulator, events, streams)
        print(f"landing emulator ceiling: {ceiling['records_per_s']:,.0f} records/s pulled and acked twice, "
              "nothing else done", flush=True)
    finally:
        emulator.stop()
        shutil.rmtree(emulator.data_dir, ignore_errors=True)
    median = {mode: statistics.median(r["records_per_s"] for r in runs[mode]) for mode in modes}
    settings = load_settings()
    return {
        "records_per_s": median["parallel_pulls"],
        "single_pull_records_per_s": median["single_pull"],
        "parallel_over_single_pull": median["parallel_pulls"] / median["single_pull"],
        "baseline_2026_11_24_records_per_s": BASELINE_RECORDS_PER_S,
        "parallel_over_baseline": median["parallel_pulls"] / BASELINE_RECORDS_PER_S,
        "single_pull_over_baseline": median["single_pull"] / BASELINE_RECORDS_PER_S,
        "emulator_ceiling": ceiling,
        "ceiling_over_baseline": ceiling["records_per_s"] / BASELINE_RECORDS_PER_S,
        "runs": runs,
        "config": {"events": events, "rounds": rounds, "pull_streams": streams, "max_messages": settings.max_messages,
                   "max_bytes": settings.max_bytes, "max_seconds": settings.max_seconds,
                   "timed": "tracking drain + pull + plan + landing file + ack, per batch, until the backlog is "
                            "landed (no ingest)"},
    }
