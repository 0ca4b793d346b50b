"""`<asset>_window_sensor` (`event_counts_window_sensor`): requests the final pane of each window as it closes.

A window `[start, end)` closes when the source watermark passes `end + allowed_lateness`; the sensor then requests
that partition with run key `<asset>:<window>:final`, in window order, from the first window with data up to the
newest one with data (empty windows in between are materialized as empty panes), never a window before the
pipeline's `start_date` (no partition exists for it; the first window's metadata counts the records before it). Under the `refire` late policy,
a batch whose oldest event falls into an already closed window requests that window's next pane
(`<asset>:<window>:pane-<p>`); the materialization closes it only if late records are really there.

A requested window stays on the cursor's `pending` list until its final pane is committed (closed, merged, and
its commit sequence written). A window whose run failed or died without that is requested again, with a new run
key per attempt (`<asset>:<window>:final:<k>`), up to `MAX_ATTEMPTS`; after that it stays pending, is named in
every tick's log and in `onceflow status`, and waits for an operator (a backfill of that partition).

The cursor holds the next window to close, the newest batch looked at for late data (both only grow) and the
pending windows with their attempts.
"""

import json

import dagster as dg

from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import sequence_id
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.panes import CloseStore, Window, first_window_start_ms
from onceflow.orchestration.sensors.runs import in_flight, runs_tagged
from onceflow.resources.lake import LakeResource

MAX_REQUESTS = 50
MAX_ATTEMPTS = 5


def final_pane_committed(closes: CloseStore, commits: CommitStore, asset: str, window: Window) -> bool:
    """The window is closed, its pane merged and its publication written ahead (the last step of the run)."""
    close = closes.latest(window)
    return close is not None and commits.get(sequence_id(asset, window.key, close.pane)) is not None


def retry_requests(
    context: dg.SensorEvaluationContext, output: WindowedOutput, closes: CloseStore, commits: CommitStore,
    pending: dict[str, int],
) -> tuple[list[dg.RunRequest], dict[str, int], list[str]]:
    """New requests for pending windows whose runs ended without committing the final pane; the pending windows
    left; and what to tell the operator."""
    requests, left, notes = [], {}, []
    for key, attempts in pending.items():
        window = Window.from_partition_key(key, output.window_s)
        if final_pane_committed(closes, commits, output.asset, window):
            continue
        runs = runs_tagged(context.instance, {"dagster/partition": key, "onceflow/window_asset": output.asset})
        if in_flight(context.instance, runs):
            left[key] = attempts
        elif attempts >= MAX_ATTEMPTS:
            left[key] = attempts
            notes.append(f"{key}: final pane not committed after {attempts} runs; backfill the partition to retry")
        else:
            left[key] = attempts + 1
            notes.append(f"{key}: its run ended without committing the final pane; attempt {attempts + 1}")
            requests.append(_request(output, window, f"final:{attempts + 1}"))
    return requests, left, notes


def _request(output: WindowedOutput, window: Window, what: str) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=f"{output.asset}:{window.key}:{what}", partition_key=window.key,
        tags={"onceflow/window_asset": output.asset},
    )


def build_window_sensor(pipeline: Pipeline, output: WindowedOutput) -> dg.SensorDefinition:
    asset = dg.AssetKey(output.asset)
    size = output.window_s

    @dg.sensor(
        name=f"{output.asset}_window_sensor",
        asset_selection=[asset],
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Requests the final pane of each `{output.asset}` window when the watermark passes its end "
        "plus the allowed lateness.",
    )
    def window_sensor(context: dg.SensorEvaluationContext, lake: LakeResource) -> dg.SensorResult | dg.SkipReason:
        checkpoint = open_source(pipeline, lake).checkpoints.load()
        watermark = source_watermark_ms(checkpoint)
        if watermark is None or checkpoint.min_event_time_ms is None or checkpoint.max_event_time_ms is None:
            return dg.SkipReason("no data and no watermark yet")
        cursor = json.loads(context.cursor) if context.cursor else {}
        # Records before the pipeline's start date are valid (raw keeps them) but have no window partition.
        first_ms = first_window_start_ms(pipeline.start_date)
        next_start = max(cursor.get("next_window_ms", Window.at(checkpoint.min_event_time_ms, size).start_ms), first_ms)
        closes, commits = CloseStore(lake.panes(), output.asset), CommitStore(lake.commits())
        requests, pending, notes = retry_requests(context, output, closes, commits, cursor.get("pending", {}))
        window = Window.at(next_start, size)
        lateness_ms = output.allowed_lateness_s * 1000
        while (
            len(requests) < MAX_REQUESTS
            and window.start_ms <= checkpoint.max_event_time_ms
            and window.end_ms + lateness_ms <= watermark
        ):
            requests.append(_request(output, window, "final"))
            pending[window.key] = 1
            window = window.next()
        seen_batch = cursor.get("seen_batch", 0)
        if output.late_policy == "refire":
            late_from = min((t for b, t in checkpoint.recent_batches if b > seen_batch), default=None)
            late = Window.at(max(late_from, first_ms), size) if late_from is not None else None
            while late is not None and late.start_ms < next_start and len(requests) < MAX_REQUESTS:
                close = closes.latest(late)
                if close is not None:
                    requests.append(_request(output, late, f"pane-{close.pane + 1}"))
                late = late.next()
        if notes:
            context.log.warning("; ".join(notes))
        cursor = {
            "next_window_ms": window.start_ms,
            "seen_batch": max(seen_batch, checkpoint.committed_batch),
            "pending": pending,
        }
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor))

    return window_sensor
