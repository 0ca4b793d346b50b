"""Publish: a closed window's pane becomes a commit sequence, written before any side effect happens.

`publish_pane` takes the pane's rows as plain values, writes them to the file sink as temp files (newline-delimited
JSON, sharded, each with its sha256), then writes the commit sequence that finalizes them: a `FileFinalize` per
shard, a `BigQueryLoad` if a BigQuery target is configured, and a `HighWatermark` last. Nothing outside the
platform can see any of it until `run_sequence` runs the steps.

File sink layout (final names are a pure function of asset, window, pane and shard, never of row contents)::

    <sink_root>/<asset>/window=<window key>/pane=<pane>/part-00000.jsonl

Every pane keeps its own directory; the newest pane of a window is its current result (a refired late pane
supersedes the on-time one). The bytes are deterministic too: rows are rendered canonically and sorted, so
publishing the same pane twice yields the same files and the same checksums.

A crash between writing the temp files and writing the sequence leaves hidden temp files
(`.part-00000.jsonl.<token>.tmp`) that no sequence refers to; publishing again writes new ones.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import TYPE_CHECKING, Any

from onceflow.jobs.publish.bigquery_load import SUMMABLE_TYPES, BigQueryLoad
from onceflow.jobs.publish.commit_records import DEFAULT_MAX_ATTEMPTS, asset_key_part
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sequence import CommitSequence, FileFinalize, HighWatermark, sequence_id
from onceflow.jobs.publish.sink_types import SinkType, json_text, json_value, parse_sink_type, timestamp_text
from onceflow.jobs.publish.step import CommitStep, sha256_hex
from onceflow.resources.faults import fault_point
from onceflow.resources.object_store import open_store

if TYPE_CHECKING:
    import pyarrow as pa

    from onceflow.jobs.windows.panes import Window

@dataclass(frozen=True)
class BigQueryTarget:
    """The BigQuery table a windowed asset is published to; the dataset must exist, the table is created.

    `key_columns` identify a row within the table: `window_start` and the output's keys.
    """

    project: str
    dataset: str
    table: str
    key_columns: tuple[str, ...] = ("window_start",)


@dataclass(frozen=True)
class PublishedPane:
    """The sequence that publishes a pane; `created` is False when an earlier publish of the pane wrote it."""

    sequence: CommitSequence
    created: bool


def pane_prefix(asset: str, window_key: str, pane: int) -> str:
    """The file sink directory of a pane, relative to the sink root."""
    return f"{asset_key_part(asset)}/window={window_key}/pane={pane}"


def publish_pane(
    store: CommitStore,
    *,
    asset: str,
    window: Window,
    pane: int,
    rows: Iterable[Mapping[str, Any]] | pa.Table,
    schema: Sequence[tuple[str, str]],
    sink_root: str | None,
    bigquery: BigQueryTarget | None = None,
    rows_per_shard: int = 100_000,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> PublishedPane:
    """Write pane `pane` of `window` as temp files plus the commit sequence that publishes them.

    `rows` are the pane's rows (dicts, or a pyarrow table) with exactly the columns of `schema` ((name, sink type)
    pairs, see `onceflow.jobs.publish.sink_types`, which also says how each type is written); TIMESTAMP values must be
    timezone-aware datetimes, NUMERIC values `Decimal` or `int`. If the
    schema has `window_start` and `pane` columns, every row must belong to this window and pane. `window` needs
    only `start_ms`, `end_ms` and `key` (a `onceflow.jobs.windows.panes.Window`). Only final panes are published: `pane` must be
    at least 1. The rows are written as files under `sink_root` (which a BigQuery load reads); with neither a
    `sink_root` nor `bigquery`, the sequence only records the high watermark.

    If the pane's sequence exists already, it stands and nothing is written. Otherwise, once the sequence is
    written, `fault_point("commit.after_write_sequence")` is passed and the caller (or the commit sensor, if the
    caller dies) runs it with `run_sequence`.
    """
    if pane < 1:
        raise ValueError(f"only final panes (1, 2, ...) are published, not pane {pane}")
    if rows_per_shard < 1:
        raise ValueError(f"rows_per_shard must be at least 1, got {rows_per_shard}")
    if bigquery is not None and sink_root is None:
        raise ValueError("a BigQuery load reads the pane's files: give a sink_root")
    seq_id = sequence_id(asset, window.key, pane)
    existing = store.get(seq_id)
    if existing is not None:
        return PublishedPane(CommitSequence.from_record(existing), False)

    types = tuple((name, parse_sink_type(kind)) for name, kind in schema)
    schema = tuple((name, str(kind)) for name, kind in types)
    lines = sorted(_render(row, types, window, pane) for row in _row_dicts(rows))
    shards = [lines[i : i + rows_per_shard] for i in range(0, len(lines), rows_per_shard)] or [[]]
    finalizes = [] if sink_root is None else _write_temp_shards(sink_root, pane_prefix(asset, window.key, pane), shards)
    steps: list[CommitStep] = list(finalizes)
    if bigquery is not None:
        steps.append(
            BigQueryLoad(
                project=bigquery.project,
                dataset=bigquery.dataset,
                table=bigquery.table,
                asset=asset,
                window_key=window.key,
                window_start_ms=window.start_ms,
                pane=pane,
                files_root=sink_root or "",
                files=tuple((f.final_key, f.sha256) for f in finalizes),
                schema=schema,
                expected_rows=len(lines),
                expected_sums=_sums(lines, schema),
                key_columns=bigquery.key_columns,
            )
        )
    steps.append(HighWatermark(asset, window.end_ms))

    sequence, created = CommitSequence(seq_id, tuple(steps), max_attempts).write(store)
    if not created:
        for step in finalizes:  # a concurrent publisher's sequence stands, with its own temp files
            open_store(step.root).delete(step.temp_key)
        return PublishedPane(sequence, False)
    fault_point("commit.after_write_sequence")
    return PublishedPane(sequence, True)


def _write_temp_shards(sink_root: str, prefix: str, shards: list[list[bytes]]) -> list[FileFinalize]:
    """Write each shard as a hidden temp file; the returned steps move them to their final names."""
    sink = open_store(sink_root)
    token = uuid.uuid4().hex[:12]
    finalizes = []
    for shard, shard_lines in enumerate(shards):
        data = b"".join(line + b"\n" for line in shard_lines)
        step = FileFinalize(
            root=sink_root,
            temp_key=f"{prefix}/.part-{shard:05d}.jsonl.{token}.tmp",
            final_key=f"{prefix}/part-{shard:05d}.jsonl",
            sha256=sha256_hex(data),
        )
        sink.write(step.temp_key, data)
        finalizes.append(step)
    return finalizes


def _row_dicts(rows: Iterable[Mapping[str, Any]] | pa.Table) -> Iterable[Mapping[str, Any]]:
    to_pylist = getattr(rows, "to_pylist", None)
    return to_pylist() if callable(to_pylist) else rows


def _render(row: Mapping[str, Any], schema: tuple[tuple[str, SinkType], ...], window: Window, pane: int) -> bytes:
    """One row as canonical JSON: columns in schema order, values in the form BigQuery loads losslessly."""
    names = [name for name, _ in schema]
    if set(row) != set(names):
        raise ValueError(f"row columns {sorted(row)} differ from the schema's {names}")
    values = {name: json_value(name, row[name], kind) for name, kind in schema}
    start = timestamp_text("window_start", datetime.fromtimestamp(window.start_ms / 1000, UTC))
    if "window_start" in values and values["window_start"] != start:
        raise ValueError(f"row {values} is not in window {window.key}")
    if "pane" in values and values["pane"] != pane:
        raise ValueError(f"row {values} is not in pane {pane}")
    return json_text(values).encode()


def _sums(lines: list[bytes], schema: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str | None], ...]:
    """Exact sums of the integer and decimal columns: with the row count, what `BigQueryLoad.verify` checks."""
    rows = [json.loads(line) for line in lines]
    sums = []
    for name, kind in schema:
        if kind in SUMMABLE_TYPES:
            values = [Decimal(str(row[name])) for row in rows if row[name] is not None]
            with localcontext(prec=200):  # the default 28 digits would round sums of NUMERIC(38, 9) values
                total = sum(values, Decimal(0))
            sums.append((name, format(total, "f") if values else None))
    return tuple(sums)
