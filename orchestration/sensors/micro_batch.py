"""`<pipeline>_micro_batch_sensor` (`events_micro_batch_sensor`): requests the next micro-batch of a source.

A batch is requested when the source has new data; when its lake holds batches its checkpoint does not (the
checkpoint was restored from an older copy: the batch realigns it, so the watermark and the windows resume even
with no new data); or, with no new data, every `idle_tick_s` while some window is still open, so that an idle
source's watermark advances and its last windows close, or while a record output has not staged every committed
batch (a run died between the raw commit and staging: the next run stages them). Never while a batch of the source is in flight (queued,
running, or failed with a Dagster retry pending): batches commit in order, one at a time, which the source's
runs' turns (`onceflow.jobs.run_relay`) enforce as well. The one exception: while the source is active, a worker run
(`ONCEFLOW_MICRO_BATCH_RUN_S`) gets its successor requested shortly before its planned end (run key
`<pipeline>:relay:<run id>`), which starts warm and takes over without a gap.

Run keys are `<pipeline>:batch:<n>`, n the batch the source checkpoint expects next. A run that ended without
committing batch n (it found no data, or failed for good) has used that key; the next request for n is then
`<pipeline>:batch:<n>:<k>` (k = runs for n so far + 1), since Dagster never launches a run key twice. The cursor
holds the last batch number requested and only grows.
"""

import json
import time

import dagster as dg
from google.api_core.exceptions import NotFound

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.ingest.micro_batch import lake_ahead
from onceflow.jobs.ingest_job import raw_asset_key, source_tag
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.record_publisher import records_behind
from onceflow.jobs.run_relay import RELAY_LEAD_S, RELAY_TAG, due_for_relay
from onceflow.jobs.run_worker import START_TIMEOUT_S
from onceflow.jobs.sources.checkpoint import SourceCheckpoint
from onceflow.jobs.sources.kafka_log import KafkaLogChanged
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.panes import Window
from onceflow.orchestration.sensors.runs import in_flight, retry_pending, runs_tagged
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource

BATCH_TAG = "onceflow/batch"


def windows_open(pipeline: Pipeline, checkpoint: SourceCheckpoint) -> bool:
    """Some output's newest window with data has not closed: the watermark has not passed its end + lateness."""
    if checkpoint.max_event_time_ms is None:
        return False
    watermark = source_watermark_ms(checkpoint)
    return any(
        watermark is None
        or watermark < Window.at(checkpoint.max_event_time_ms, o.window_s).end_ms + o.allowed_lateness_s * 1000
        for o in pipeline.windowed_outputs
    )


def active(instance: dg.DagsterInstance, pipeline: Pipeline, checkpoint: SourceCheckpoint, within_s: float) -> bool:
    """Whether the source committed a batch in the last `within_s` seconds, or some window waits for its watermark:
    then a worker run is relayed by the next one instead of ending."""
    latest = instance.get_latest_materialization_event(raw_asset_key(pipeline))
    # A pruned run's batch reported again (`run_retention`) is old news, whenever it was reported.
    pruned = latest is not None and latest.asset_materialization is not None and (
        "pruned_run_id" in latest.asset_materialization.metadata)
    recent = latest is not None and not pruned and time.time() - latest.timestamp < within_s
    return recent or windows_open(pipeline, checkpoint)


def relay_request(
    instance: dg.DagsterInstance, pipeline: Pipeline, runs: list[dg.DagsterRun], checkpoint: SourceCheckpoint,
    warm_s: float, start_timeout_s: float = START_TIMEOUT_S,
) -> dg.RunRequest | None:
    """The next worker run, requested before the current one's planned end while the source is active."""
    if any(retry_pending(instance, run) for run in runs):
        return None
    current = due_for_relay(instance, runs, int(time.time() * 1000), start_timeout_s)
    if current is None or not active(instance, pipeline, checkpoint, max(warm_s, RELAY_LEAD_S)):
        return None
    return dg.RunRequest(run_key=f"{pipeline.name}:relay:{current.run_id}", tags={
        **source_tag(pipeline), RELAY_TAG: current.run_id, "onceflow/why": f"relay: takes over from {current.run_id}"})


def build_micro_batch_sensor(
    pipeline: Pipeline, idle_tick_s: float, run_s: float = 0.0, keep_warm_s: float = 0.0,
    start_timeout_s: float = START_TIMEOUT_S,
) -> dg.SensorDefinition:
    """The sensor; with worker runs (`run_s` > 0), it relays them while the source committed a batch within
    `keep_warm_s` (default: `run_s`) or a window waits for its watermark. A run that never began its work within
    `start_timeout_s` is reported failed and no longer counts as in flight."""
    job_name = f"ingest_{pipeline.name}"

    @dg.sensor(
        name=f"{pipeline.name}_micro_batch_sensor",
        job_name=job_name,
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Requests the next micro-batch of `{pipeline.source_id}` when it has new data.",
    )
    def micro_batch_sensor(
        context: dg.SensorEvaluationContext, onceflow_lake: LakeResource, onceflow_pubsub: PubSubResource
    ) -> dg.SensorResult | dg.SkipReason:
        tags = source_tag(pipeline)
        runs = runs_tagged(context.instance, tags, limit=5)
        busy = in_flight(context.instance, runs, start_timeout_s)
        source = open_source(pipeline, onceflow_lake, onceflow_pubsub.client)
        if busy:
            relay = relay_request(context.instance, pipeline, runs, source.checkpoints.load(), keep_warm_s or run_s,
                                  start_timeout_s) if run_s else None
            return dg.SensorResult(run_requests=[relay]) if relay else dg.SkipReason(f"a batch is in flight: {busy}")
        checkpoint = source.checkpoints.load()
        cursor = json.loads(context.cursor) if context.cursor else {"batch": 0, "at_ms": 0}
        now_ms = int(time.time() * 1000)
        try:
            has_data = source.reader.has_data(checkpoint)
        except NotFound as missing:  # the operator has not created the subscription yet: say so, keep ticking
            return dg.SkipReason(f"{pipeline.source_id}: {missing.message}")
        except KafkaLogChanged as changed:
            # Every run would fail on it, and a run in flight makes `onceflow reset` wait: stop asking for runs.
            return dg.SkipReason(f"the source is stopped: {changed}")
        if has_data:
            why = "new data"
        elif lake_ahead(source, checkpoint.committed_batch):
            # Restored from an older copy, or a batch died between its two commits: realign it, replay that one.
            why = "the lake is ahead of the checkpoint: realign it"
        elif windows_open(pipeline, checkpoint) and now_ms - cursor["at_ms"] >= idle_tick_s * 1000:
            why = "idle tick: advance the watermark"
        elif (now_ms - cursor["at_ms"] >= idle_tick_s * 1000
              and records_behind(source, CommitStore(onceflow_lake.commits()))):
            why = "a record output has not staged every committed batch: publish them"
        else:
            return dg.SkipReason("no new data, and no window waiting for the watermark")
        batch = max(checkpoint.next_batch, cursor["batch"])
        earlier = len(runs_tagged(context.instance, {**tags, BATCH_TAG: str(batch)}))
        run_key = f"{pipeline.name}:batch:{batch}" + (f":{earlier + 1}" if earlier else "")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=run_key, tags={**tags, BATCH_TAG: str(batch), "onceflow/why": why})],
            cursor=json.dumps({"batch": batch, "at_ms": now_ms}),
        )

    return micro_batch_sensor
