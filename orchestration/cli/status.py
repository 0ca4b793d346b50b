"""`onceflow status`, and the commands `status` and `verify`.

`status` reads only onceflow's own state (checkpoints, pane closes, commit sequences), so it answers in a moment
and needs no Spark: per source its watermark, lag, last batch and backlog; per window its newest pane and whether
it is published; commit sequences pending or quarantined. `--json` gives the same as one document, `--pipeline`
limits it to the pipelines named. `verify` is `onceflow.orchestration.cli.verify`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
from onceflow.jobs.declare.record_output import RecordOutput
from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_sequence import batch_of, publications_of
from onceflow.jobs.publish.sequence import sequence_id
from onceflow.jobs.sources.checkpoint import SourceCheckpoint
from onceflow.jobs.sources.reader import SourceRuntime, open_source, source_watermark_ms
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.orchestration.cli.commits import describe
from onceflow.orchestration.cli.verify import (
    UnknownPipeline,
    add_selection,
    cmd_verify,
    selected,
    stdout_to_stderr,
)
from onceflow.orchestration.deployments import LAKE, PUBSUB, resources_for
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.sensors.window import final_pane_committed
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings


def _iso(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def backlog(source: SourceRuntime) -> str:
    try:
        return source.reader.backlog(source.checkpoints.load())
    except Exception as error:  # status must still show the rest when the source is unreachable
        return f"unknown ({type(error).__name__})"


def source_status(source: SourceRuntime) -> dict[str, Any]:
    """A source's state as `status --json` gives it: watermark (epoch ms) and its lag, the last batch, backlog,
    the checkpoint's totals."""
    checkpoint = source.checkpoints.load()
    watermark = source_watermark_ms(checkpoint)
    return {
        "source": source.pipeline.source_id,
        "watermark_ms": watermark,
        "lag_s": None if watermark is None else round(time.time() - watermark / 1000, 1),
        "committed_batch": checkpoint.committed_batch,
        "updated_at_ms": checkpoint.updated_at_ms,
        "backlog": backlog(source),
        "totals": dict(sorted(checkpoint.totals.items())),
    }


def source_lines(source: SourceRuntime) -> list[str]:
    return _source_text(source_status(source))


def _source_text(doc: dict[str, Any]) -> list[str]:
    lag = "-" if doc["lag_s"] is None else f"{doc['lag_s']:.1f}s"
    totals = ", ".join(f"{k} {v}" for k, v in doc["totals"].items()) or "-"
    return [
        f"source {doc['source']}",
        f"  watermark {_iso(doc['watermark_ms'])} (lag {lag}); last batch {doc['committed_batch']} at "
        f"{_iso(doc['updated_at_ms'])}; backlog {doc['backlog']}",
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


def window_status(
    output: WindowedOutput, checkpoint: SourceCheckpoint, lake: LakeResource, commits: CommitStore, limit: int = 20
) -> dict[str, Any]:
    """An output's windows: how many closed, those still waiting for a final pane, the newest `limit` panes."""
    closes = CloseStore(lake.panes(), output.asset)
    windows = closes.windows(output.window_s)
    newest = []
    for window in windows[-limit:]:
        close = closes.latest(window)
        if close is None:
            continue
        seq = sequence_id(output.asset, window.key, close.pane)
        state = commits.state(seq).status if commits.get(seq) is not None else "not written"
        newest.append({"window": window.key, "pane": close.pane, "timing": close.timing,
                       "raw_version": close.raw_version, "publication": state})
    return {"asset": output.asset, "closed_windows": len(windows), "limit": limit,
            "waiting": waiting_windows(output, checkpoint, closes, commits), "newest": newest}


def _window_text(doc: dict[str, Any]) -> list[str]:
    newest = f" (newest {doc['limit']})" if doc["closed_windows"] > doc["limit"] else ""
    lines = [f"asset {doc['asset']}: {doc['closed_windows']} closed windows{newest}"]
    if doc["waiting"]:
        lines.append(f"  waiting for a committed final pane: {len(doc['waiting'])} windows: "
                     f"{', '.join(doc['waiting'][:10])}")
    for pane in doc["newest"]:
        state = pane["publication"]
        published = "published" if state == "done" else f"publication {state}"
        lines.append(f"  {pane['window']}  pane {pane['pane']} ({pane['timing']}) at raw v{pane['raw_version']}  "
                     f"{published}")
    return lines


def record_status(output: RecordOutput, committed_batch: int | None, commits: CommitStore) -> dict[str, Any]:
    """A record output's state as `status --json` gives it: its newest published batch (done in every sink), the
    batches staged and not done yet, and its lag behind the raw table, in batches."""
    states = {batch_of(seq): commits.state(seq).status for seq, _ in publications_of(commits, output.asset)}
    done = [batch for batch, status in states.items() if status == DONE]
    pending = [batch for batch, status in states.items() if status != DONE]
    last = max(done, default=None)
    return {"asset": output.asset, "sinks": [sink.name for sink in output.sinks], "last_published_batch": last,
            "not_done": pending, "lag_batches": None if committed_batch is None else committed_batch - (last or 0)}


def _record_text(doc: dict[str, Any]) -> list[str]:
    pending = f"; not done: batches {', '.join(map(str, doc['not_done'][:10]))}" if doc["not_done"] else ""
    return [f"record output {doc['asset']} -> {', '.join(doc['sinks'])}: last published batch "
            f"{doc['last_published_batch']} (lag {doc['lag_batches']} batches){pending}"]


def status_document(pipelines: list[Pipeline], resources: dict[str, Any]) -> dict[str, Any]:
    lake: LakeResource = resources[LAKE]
    commits = CommitStore(lake.commits())
    sources = []
    for pipeline in pipelines:
        source = open_source(pipeline, lake, resources[PUBSUB].client)
        checkpoint = source.checkpoints.load()
        sources.append({"pipeline": pipeline.name, **source_status(source),
                        "outputs": [window_status(o, checkpoint, lake, commits) for o in pipeline.windowed_outputs],
                        "record_outputs": [record_status(o, checkpoint.committed_batch, commits)
                                           for o in pipeline.record_outputs]})
    pending, quarantined = commits.unfinished(), commits.quarantined()
    return {"home": lake.home, "pipelines": sources, "commits": {
        "pending": pending, "quarantined": quarantined,
        "described": [describe(commits.state(s)) for s in quarantined + pending]}}


def cmd_status(args: argparse.Namespace) -> int:
    settings = load_settings()
    try:
        pipelines = selected(load_pipelines(settings), args.pipeline)
    except UnknownPipeline as error:
        print(f"onceflow status: {error}", file=sys.stderr)
        return 2
    with stdout_to_stderr() if args.json else contextlib.nullcontext():
        doc = status_document(pipelines, resources_for(settings))
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 0
    lines = [f"onceflow home {doc['home']}"]
    for source in doc["pipelines"]:
        lines += _source_text(source)
        for output in source["outputs"]:
            lines += _window_text(output)
        for record in source["record_outputs"]:
            lines += _record_text(record)
    commits = doc["commits"]
    lines.append(f"commit sequences: {len(commits['pending'])} pending, {len(commits['quarantined'])} quarantined")
    lines += ["  " + text.replace("\n", "\n  ") for text in commits["described"]]
    print("\n".join(lines))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    add_selection(sub.add_parser("status", help="sources, watermarks, windows, commit sequences")).set_defaults(
        func=cmd_status)
    add_selection(sub.add_parser("verify", help="the reconciliation; exit 1 on a mismatch, 2 on an error")
                  ).set_defaults(func=cmd_verify)
