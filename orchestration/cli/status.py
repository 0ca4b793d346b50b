"""`onceflow status` and `onceflow verify`.

`status` reads only onceflow's own state (checkpoints, pane closes, commit sequences), so it answers in a moment
and needs no Spark: per source its watermark, lag, last batch and backlog; per window its newest pane and whether
it is published; commit sequences pending or quarantined. `verify` runs the reconciliation (`onceflow.jobs.verify.reconcile`) with
Spark and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import sequence_id
from onceflow.jobs.publish.sinks import files_root
from onceflow.jobs.sources.checkpoint import EpochStore, SourceCheckpoint
from onceflow.jobs.sources.reader import SourceRuntime, open_source, source_watermark_ms
from onceflow.jobs.verify.landed import landed_records
from onceflow.jobs.verify.reconcile import (
    SourceReconciliation,
    WindowReconciliation,
    reconcile,
    reconcile_source,
    render,
)
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.orchestration.cli.commits import describe
from onceflow.orchestration.deployments import resources_for
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.sensors.window import final_pane_committed
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _iso(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def backlog(source: SourceRuntime) -> str:
    try:
        return source.reader.backlog(source.checkpoints.load())
    except Exception as error:  # status must still show the rest when the source is unreachable
        return f"unknown ({type(error).__name__})"


def source_lines(source: SourceRuntime) -> list[str]:
    checkpoint = source.checkpoints.load()
    watermark = source_watermark_ms(checkpoint)
    lag = "-" if watermark is None else f"{time.time() - watermark / 1000:.1f}s"
    totals = ", ".join(f"{k} {v}" for k, v in sorted(checkpoint.totals.items())) or "-"
    return [
        f"source {source.pipeline.source_id}",
        f"  watermark {_iso(watermark)} (lag {lag}); last batch {checkpoint.committed_batch} at "
        f"{_iso(checkpoint.updated_at_ms)}; backlog {backlog(source)}",
        f"  totals: {totals}",
    ]


def waiting_windows(
    output: WindowedOutput, checkpoint: SourceCheckpoint, closes: CloseStore, commits: CommitStore, scan: int = 200
) -> list[str]:
    """Keys of the newest `scan` windows the watermark has passed (with data up to them) whose final pane is not
    committed: what the window sensor keeps asking for, or has given up on."""
    watermark = source_watermark_ms(checkpoint)
    if watermark is None or checkpoint.min_event_time_ms is None or checkpoint.max_event_time_ms is None:
        return []
    size = output.window_s * 1000
    due_until = Window.at(watermark - output.allowed_lateness_s * 1000, output.window_s).start_ms
    last = min(due_until - size, Window.at(checkpoint.max_event_time_ms, output.window_s).start_ms)
    first = max(Window.at(checkpoint.min_event_time_ms, output.window_s).start_ms, last - (scan - 1) * size)
    waiting = []
    for start in range(first, last + 1, size):
        window = Window(start, start + size)
        if not final_pane_committed(closes, commits, output.asset, window):
            waiting.append(window.key)
    return waiting


def window_lines(
    output: WindowedOutput, checkpoint: SourceCheckpoint, lake: LakeResource, commits: CommitStore, limit: int = 20
) -> list[str]:
    closes = CloseStore(lake.panes(), output.asset)
    windows = closes.windows(output.window_s)
    newest = f" (newest {limit})" if len(windows) > limit else ""
    lines = [f"asset {output.asset}: {len(windows)} closed windows{newest}"]
    waiting = waiting_windows(output, checkpoint, closes, commits)
    if waiting:
        lines.append(f"  waiting for a committed final pane: {len(waiting)} windows: {', '.join(waiting[:10])}")
    for window in windows[-limit:]:
        close = closes.latest(window)
        if close is None:
            continue
        seq = sequence_id(output.asset, window.key, close.pane)
        state = commits.state(seq).status if commits.get(seq) is not None else "not written"
        published = "published" if state == "done" else f"publication {state}"
        lines.append(f"  {window.key}  pane {close.pane} ({close.timing}) at raw v{close.raw_version}  {published}")
    return lines


def cmd_status(_: argparse.Namespace) -> int:
    settings = load_settings()
    resources = resources_for(settings)
    lake: LakeResource = resources["lake"]
    commits = CommitStore(lake.commits())
    lines = [f"onceflow home {lake.home}"]
    for pipeline in load_pipelines(settings):
        source = open_source(pipeline, lake, resources["pubsub"].client)
        lines += source_lines(source)
        for output in pipeline.outputs:
            lines += window_lines(output, source.checkpoints.load(), lake, commits)
    pending, quarantined = commits.unfinished(), commits.quarantined()
    lines.append(f"commit sequences: {len(pending)} pending, {len(quarantined)} quarantined")
    lines += ["  " + describe(commits.state(s)).replace("\n", "\n  ") for s in quarantined + pending]
    print("\n".join(lines))
    return 0


def reconcile_pipeline(
    spark: SparkSession, pipeline: Pipeline, lake: LakeResource
) -> tuple[SourceReconciliation, dict[str, list[WindowReconciliation]]]:
    """The reconciliation of a pipeline: its source's, and every output's per window (see `onceflow.jobs.verify.reconcile`)."""
    source = open_source(pipeline, lake)  # landed batches only: the source itself is not read
    epochs = range(EpochStore(lake.epochs()).current(pipeline.name))
    landed = landed_records(*(open_source(pipeline, lake, epoch=e) for e in epochs), source)
    commits = CommitStore(lake.commits())
    outputs = {
        output.asset: reconcile(
            spark, source, output, CloseStore(lake.panes(), output.asset), commits, lake.table_path(output.table),
            files_root(output, lake.sink_root(), lake.staging_root()), landed.records,
        )
        for output in pipeline.outputs
    }
    return reconcile_source(source, landed), outputs


def verify(spark: SparkSession, pipelines: list[Pipeline], lake: LakeResource) -> bool:
    """Print the reconciliation of every pipeline, each with a verdict of its own; True when exactly-once held
    everywhere."""
    held_everywhere = True
    for pipeline in pipelines:
        source, outputs = reconcile_pipeline(spark, pipeline, lake)
        for problem, ids in (("lost (landed, held nowhere)", source.lost), ("twice in raw", source.doubled_raw),
                             ("twice in the dead letters", source.doubled_dead)):
            if ids:
                print(f"{pipeline.name}: {len(ids)} record IDs {problem}: {', '.join(ids[:10])}")
        for line in [*source.metric_mismatches, *source.notes]:
            print(f"{pipeline.name}: {line}")
        held = source.ok
        for asset, rows in outputs.items():
            print(f"{pipeline.name} {asset}: received = inserted + duplicates + late + dead-lettered, per window")
            print(render(rows))
            bad = [r.window for r in rows if not r.ok]
            held = held and not bad
            print(f"{pipeline.name} {asset}: {'MISMATCH in ' + ', '.join(bad) if bad else 'windows reconcile'}")
        print(f"{pipeline.name}: {'exactly-once holds' if held else 'exactly-once VIOLATED'}")
        held_everywhere = held_everywhere and held
    return held_everywhere


def cmd_verify(_: argparse.Namespace) -> int:
    """Exit 0 when exactly-once held, 1 on a mismatch, 2 on an error (named on stderr): never a traceback for what
    the tables or the sources hold."""
    try:
        settings = load_settings()
        resources = resources_for(settings)
        ok = verify(resources["spark"].get_session(), load_pipelines(settings), resources["lake"])
    except Exception as error:
        print(f"onceflow verify: could not reconcile: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    return 0 if ok else 1


def add_commands(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("status", help="sources, watermarks, windows, commit sequences").set_defaults(func=cmd_status)
    sub.add_parser("verify", help="the reconciliation; non-zero exit on a mismatch").set_defaults(func=cmd_verify)
