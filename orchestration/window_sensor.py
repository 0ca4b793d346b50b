"""`<asset>_window_sensor` (`event_counts_window_sensor`): requests the final pane of each window as it closes.

A window `[start, end)` closes when the source watermark passes `end + allowed_lateness`; the sensor then requests
that partition with run key `<asset>:<window>:final`, in window order, from the first window with data up to the
newest one with data (empty windows in between are materialized as empty panes). Under the `refire` late policy,
a batch whose oldest event falls into an already closed window requests that window's next pane
(`<asset>:<window>:pane-<p>`); the materialization closes it only if late records are really there.

The cursor holds the next window to close and the newest batch looked at for late data; both only grow.
"""

import json

import dagster as dg

from jobs.declaration import Pipeline, WindowedOutput
from jobs.panes import CloseStore, Window
from jobs.source_reader import source_watermark_ms
from resources.checkpoint import CheckpointStore
from resources.lake import LakeResource

MAX_REQUESTS = 50


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
        checkpoint = CheckpointStore(lake.checkpoints(), pipeline.source_id).load()
        watermark = source_watermark_ms(checkpoint)
        if watermark is None or checkpoint.min_event_time_ms is None or checkpoint.max_event_time_ms is None:
            return dg.SkipReason("no data and no watermark yet")
        cursor = json.loads(context.cursor) if context.cursor else {}
        next_start = cursor.get("next_window_ms", Window.at(checkpoint.min_event_time_ms, size).start_ms)
        requests = []
        window = Window.at(next_start, size)
        lateness_ms = output.allowed_lateness_s * 1000
        while (
            len(requests) < MAX_REQUESTS
            and window.start_ms <= checkpoint.max_event_time_ms
            and window.end_ms + lateness_ms <= watermark
        ):
            requests.append(dg.RunRequest(run_key=f"{output.asset}:{window.key}:final", partition_key=window.key))
            window = window.next()
        seen_batch = cursor.get("seen_batch", 0)
        if output.late_policy == "refire":
            closes = CloseStore(lake.checkpoints(), output.asset)
            late_from = min((t for b, t in checkpoint.recent_batches if b > seen_batch), default=None)
            late = Window.at(late_from, size) if late_from is not None else None
            while late is not None and late.start_ms < next_start and len(requests) < MAX_REQUESTS:
                close = closes.latest(late)
                if close is not None:
                    requests.append(
                        dg.RunRequest(run_key=f"{output.asset}:{late.key}:pane-{close.pane + 1}", partition_key=late.key)
                    )
                late = late.next()
        cursor = {"next_window_ms": window.start_ms, "seen_batch": max(seen_batch, checkpoint.committed_batch)}
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor))

    return window_sensor
