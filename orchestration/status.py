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

from jobs.micro_batch import source_handles, source_watermark_ms
from jobs.pipeline import FileSourceSpec, Pipeline
from jobs.reconcile import reconcile, render
from jobs.windows import CloseStore
from orchestration.commits_cli import describe
from orchestration.pipelines import PIPELINES
from resources.checkpoint import CheckpointStore
from resources.commit_store import CommitStore
from resources.files import FileSource
from resources.lake import LakeResource
from resources.pubsub import PubSubResource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _iso(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def backlog(pipeline: Pipeline, lake: LakeResource) -> str:
    spec = pipeline.source
    checkpoint = CheckpointStore(lake.checkpoints(), pipeline.source_id).load()
    if isinstance(spec, FileSourceSpec):
        new = FileSource(spec.directory, spec.pattern).discover(set(checkpoint.taken_files), 10**9, 2**62)
        return f"{len(new)} new files"
    try:
        waiting = PubSubResource.from_env().client().has_messages(spec.subscription, timeout_s=2.0)
    except Exception as error:  # status must still show the rest when Pub/Sub is unreachable
        return f"unknown ({type(error).__name__})"
    return "messages waiting" if waiting else "empty"


def source_lines(pipeline: Pipeline, lake: LakeResource) -> list[str]:
    checkpoint = CheckpointStore(lake.checkpoints(), pipeline.source_id).load()
    watermark = source_watermark_ms(checkpoint)
    lag = "-" if watermark is None else f"{time.time() - watermark / 1000:.1f}s"
    totals = ", ".join(f"{k} {v}" for k, v in sorted(checkpoint.totals.items())) or "-"
    return [
        f"source {pipeline.source_id}",
        f"  watermark {_iso(watermark)} (lag {lag}); last batch {checkpoint.committed_batch} at "
        f"{_iso(checkpoint.updated_at_ms)}; backlog {backlog(pipeline, lake)}",
        f"  totals: {totals}",
    ]


def window_lines(pipeline: Pipeline, lake: LakeResource, commits: CommitStore, limit: int = 20) -> list[str]:
    closes = CloseStore(lake.checkpoints(), pipeline.window_asset)
    windows = closes.windows(pipeline.window_s)
    newest = f" (newest {limit})" if len(windows) > limit else ""
    lines = [f"asset {pipeline.window_asset}: {len(windows)} closed windows{newest}"]
    for window in windows[-limit:]:
        close = closes.latest(window)
        assert close is not None
        seq = f"{pipeline.window_asset}:{window.key}:pane-{close.pane}"
        state = commits.state(seq).status if commits.get(seq) is not None else "not written"
        published = "published" if state == "done" else f"publication {state}"
        lines.append(f"  {window.key}  pane {close.pane} ({close.timing}) at raw v{close.raw_version}  {published}")
    return lines


def cmd_status(_: argparse.Namespace) -> int:
    lake = LakeResource.from_env()
    commits = CommitStore(lake.commits())
    lines = [f"onceflow home {lake.home}"]
    for pipeline in PIPELINES:
        lines += source_lines(pipeline, lake) + window_lines(pipeline, lake, commits)
    pending, quarantined = commits.unfinished(), commits.quarantined()
    lines.append(f"commit sequences: {len(pending)} pending, {len(quarantined)} quarantined")
    lines += ["  " + describe(commits.state(s)).replace("\n", "\n  ") for s in quarantined + pending]
    print("\n".join(lines))
    return 0


def verify(spark: SparkSession, lake: LakeResource) -> bool:
    """Print the reconciliation of every pipeline; True when exactly-once held everywhere."""
    ok = True
    for pipeline in PIPELINES:
        rows = reconcile(
            spark,
            pipeline,
            source_handles(pipeline, lake, None),  # landed batches only: the source itself is not read
            CloseStore(lake.checkpoints(), pipeline.window_asset),
            CommitStore(lake.commits()),
            lake.table_path(pipeline.windows_table),
        )
        print(f"{pipeline.name}: received = inserted + duplicates + late + dead-lettered, per window")
        print(render(rows))
        bad = [r.window for r in rows if not r.ok]
        ok = ok and not bad
        print(f"{pipeline.name}: {'exactly-once holds' if not bad else 'MISMATCH in ' + ', '.join(bad)}")
    return ok


def cmd_verify(_: argparse.Namespace) -> int:
    from resources.spark import SparkResource

    return 0 if verify(SparkResource.from_env().get_session(), LakeResource.from_env()) else 1


def add_commands(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("status", help="sources, watermarks, windows, commit sequences").set_defaults(func=cmd_status)
    sub.add_parser("verify", help="the reconciliation; non-zero exit on a mismatch").set_defaults(func=cmd_verify)
