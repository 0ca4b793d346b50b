"""`<asset>_window_sensor` (`event_counts_window_sensor`): requests the final pane of each window as it closes.

A window `[start, end)` closes when the source watermark passes `end + allowed_lateness`; the sensor then requests
that partition with run key `<asset>:<window>:final`, in window order, from the first window with data up to the
newest one with data (empty windows in between are materialized as empty panes), never a window before the
pipeline's `start_date` (no partition exists for it; the first window's metadata counts the records before it). Under the `refire` late policy,
each closed window a batch brought late rows to gets its next pane requested (`<asset>:<window>:pane-<p>`), resumably
across ticks (`onceflow.orchestration.sensors.refire`); the materialization closes it only if late rows are there.

A requested window stays on the cursor's `pending` list until the run asked for has done its part: a final pane
is committed (closed, merged, and its commit sequence written); a refire run ended successfully (it found the late
rows, or none). A window whose run failed or died first is requested again, with a new run key per attempt
(`<asset>:<window>:final:<k>`, `...:pane-<p>:<k>`), up to `MAX_ATTEMPTS`; after that it stays pending, is named in
every tick's log, and waits for an operator (a backfill of that partition). A final run that succeeded without
closing the window saw an older watermark than the sensor did (the checkpoint was restored from an older copy in
between): while the watermark is behind the window again that is no failure, and the window is asked for again
once the watermark passes it. Late rows for a window still pending get it one more pane once its run has ended
(that run may have read raw before them).

Rows older than every window looked at so far (a backlog read out of order: a Kafka partition or a file behind
the others) move the first window back: if no window was asked for yet the scan starts there; if later windows
were, those older ones are due too and are asked for at once, newest first across ticks when there are many.

The cursor holds the first window looked at, the next window to close, the newest batch looked at for late data
(the last two only grow), the windows waiting for a refire request, and the pending windows with their attempts.
"""

import json

import dagster as dg

from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import sequence_id
from onceflow.jobs.run_worker import START_TIMEOUT_S
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.panes import CloseStore, Window, first_window_start_ms
from onceflow.orchestration.sensors.refire import RefireCursor, look_at_batches, minutes_of
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
    pending: dict[str, dict], watermark_ms: int, start_timeout_s: float = START_TIMEOUT_S,
) -> tuple[list[dg.RunRequest], dict[str, dict], list[str]]:
    """New requests for pending windows whose runs ended without doing their part; the pending windows left; and
    what to tell the operator. A pending entry is `{"attempts": n, "final": bool, "what": <run key part>}`, and
    `"again": true` when late rows came for the window while it was pending."""
    requests, left, notes = [], {}, []
    for key, entry in pending.items():
        entry = _pending_entry(entry)
        window = Window.from_partition_key(key, output.window_s)
        committed = entry["final"] and final_pane_committed(closes, commits, output.asset, window)
        if committed and not entry.get("again"):
            continue
        runs = runs_tagged(context.instance, {"dagster/partition": key, "onceflow/window_asset": output.asset})
        if in_flight(context.instance, runs, start_timeout_s):
            left[key] = entry
            continue
        succeeded = bool(runs) and runs[0].status == dg.DagsterRunStatus.SUCCESS
        if committed or (succeeded and not entry["final"]):
            if entry.get("again"):  # its run may have read raw before those late rows: one more pane
                close = closes.latest(window)
                what = f"pane-{close.pane + 1}" if close else "final"
                left[key] = {"attempts": 1, "final": close is None, "what": what}
                requests.append(_request(output, window, f"{what}:{len(runs) + 1}"))
            continue
        if succeeded and watermark_ms < window.end_ms + output.allowed_lateness_s * 1000:
            left[key] = entry  # its run saw the window still open, as the sensor does now: wait, no attempt used
        elif entry["attempts"] >= MAX_ATTEMPTS:
            left[key] = entry
            notes.append(f"{key}: not committed after {entry['attempts']} failed runs; backfill the partition")
        else:
            left[key] = {**entry, "attempts": entry["attempts"] + 1}
            notes.append(f"{key}: its run ended without committing its pane; attempt {entry['attempts'] + 1}")
            requests.append(_request(output, window, f"{entry['what']}:{len(runs) + 1}"))
    return requests, left, notes


def _pending_entry(entry: dict | int) -> dict:
    """A pending entry; a cursor written before refires were tracked holds a final pane's attempts alone."""
    return _final_entry(entry) if isinstance(entry, int) else entry


def _final_entry(attempts: int = 1) -> dict:
    return {"attempts": attempts, "final": True, "what": "final"}


def _request(output: WindowedOutput, window: Window, what: str) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=f"{output.asset}:{window.key}:{what}", partition_key=window.key,
        tags={"onceflow/window_asset": output.asset},
    )


def build_window_sensor(
    pipeline: Pipeline, output: WindowedOutput, start_timeout_s: float = START_TIMEOUT_S
) -> dg.SensorDefinition:
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
    def window_sensor(
        context: dg.SensorEvaluationContext, onceflow_lake: LakeResource
    ) -> dg.SensorResult | dg.SkipReason:
        checkpoint = open_source(pipeline, onceflow_lake).checkpoints.load()
        watermark = source_watermark_ms(checkpoint)
        if watermark is None or checkpoint.min_event_time_ms is None or checkpoint.max_event_time_ms is None:
            return dg.SkipReason("no data and no watermark yet")
        cursor = json.loads(context.cursor) if context.cursor else {}
        # Records before the pipeline's start date are valid (raw keeps them) but have no window partition.
        first_ms = first_window_start_ms(pipeline.start_date)
        min_start = max(Window.at(checkpoint.min_event_time_ms, size).start_ms, first_ms)
        next_start = max(cursor.get("next_window_ms", min_start), first_ms)
        closes, commits = CloseStore(onceflow_lake.panes(), output.asset), CommitStore(onceflow_lake.commits())
        requests, pending, notes = retry_requests(
            context, output, closes, commits, cursor.get("pending", {}), watermark, start_timeout_s
        )
        refire = RefireCursor.of(cursor)
        if output.late_policy == "refire":  # batches looked at before this tick's finals: those will read them
            look_at_batches(refire, checkpoint, output, closes, minutes_of(pipeline, onceflow_lake),
                            (first_ms, next_start), pending)
        first_seen = cursor.get("first_window_ms", min_start)
        if min_start < first_seen and next_start <= first_seen:  # none asked for yet: the scan starts earlier
            next_start = first_seen = min_start
        early = []  # rows older than every window asked for (a backlog read out of order): those windows are due
        while min_start < first_seen and len(requests) + len(early) < MAX_REQUESTS:
            first_seen -= size * 1000
            early.insert(0, Window.at(first_seen, size))
        for window in early:
            requests.append(_request(output, window, "final"))
            pending[window.key] = _final_entry()
        window = Window.at(next_start, size)
        lateness_ms = output.allowed_lateness_s * 1000
        while (
            len(requests) < MAX_REQUESTS
            and window.start_ms <= checkpoint.max_event_time_ms
            and window.end_ms + lateness_ms <= watermark
        ):
            requests.append(_request(output, window, "final"))
            pending[window.key] = _final_entry()
            window = window.next()
        if output.late_policy == "refire":
            waiting = []
            for start in refire.queue:
                late = Window(start, start + size * 1000)
                close = closes.latest(late)
                if late.key in pending:  # its pending run may miss these rows: it is asked for again after
                    pending[late.key] = {**pending[late.key], "again": True}
                elif len(requests) >= MAX_REQUESTS or close is None:
                    waiting.append(start)  # the next tick asks for it
                else:  # a run key of its own: an earlier refire of this pane may have found nothing late
                    what = f"pane-{close.pane + 1}"
                    earlier = len(runs_tagged(context.instance, {"dagster/partition": late.key,
                                                                 "onceflow/window_asset": output.asset}))
                    requests.append(_request(output, late, what + (f":{earlier + 1}" if earlier else "")))
                    pending[late.key] = {"attempts": 1, "final": False, "what": what}
            refire.queue = waiting
        else:
            refire.seen_batch = checkpoint.committed_batch
        if notes:
            context.log.warning("; ".join(notes))
        cursor = {"first_window_ms": first_seen, "next_window_ms": window.start_ms, **refire.to_dict(),
                  "pending": pending}
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor))

    return window_sensor
