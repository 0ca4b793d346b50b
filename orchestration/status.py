"""`onceflow status` and `onceflow verify`.

`status` reads only onceflow's own state (checkpoints, pane closes, commit sequences), so it answers in a moment
and needs no Spark: per source its watermark, lag, last batch and backlog; per window its newest pane and whether
it is published; commit sequences pending or quarantined. `verify` runs the reconciliation (`jobs.reconcile`) with
Spark and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from jobs.commit_steps import sequence_id
from jobs.declaration import Pipeline, WindowedOutput
from jobs.panes import CloseStore, Window
from jobs.reconcile import reconcile, render
from jobs.source_reader import SourceRuntime, open_source, source_watermark_ms
from orchestration.commits_cli import describe
from orchestration.pipelines import load_pipelines
from orchestration.resources import resources_for
from orchestration.window_sensor import final_pane_committed
from resources.checkpoint import SourceCheckpoint
from resources.commit_store import CommitStore
from resources.lake import LakeResource
from resources.settings import load_settings

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


def verify(spark: SparkSession, pipelines: list[Pipeline], lake: LakeResource) -> bool:
    """Print the reconciliation of every output; True when exactly-once held everywhere."""
    ok = True
    commits = CommitStore(lake.commits())
    for pipeline in pipelines:
        source = open_source(pipeline, lake)  # landed batches only: the source itself is not read
        for output in pipeline.outputs:
            closes = CloseStore(lake.panes(), output.asset)
            rows = reconcile(spark, source, output, closes, commits, lake.table_path(output.table))
            print(f"{pipeline.name} {output.asset}: received = inserted + duplicates + late + dead-lettered, per window")
            print(render(rows))
            bad = [r.window for r in rows if not r.ok]
            ok = ok and not bad
            print(f"{pipeline.name} {output.asset}: {'exactly-once holds' if not bad else 'MISMATCH in ' + ', '.join(bad)}")
    return ok


def cmd_verify(_: argparse.Namespace) -> int:
    settings = load_settings()
    resources = resources_for(settings)
    ok = verify(resources["spark"].get_session(), load_pipelines(settings), resources["lake"])
    return 0 if ok else 1


def add_commands(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("status", help="sources, watermarks, windows, commit sequences").set_defaults(func=cmd_status)
    sub.add_parser("verify", help="the reconciliation; non-zero exit on a mismatch").set_defaults(func=cmd_verify)
