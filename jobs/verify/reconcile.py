"""Reconciliation from independent facts: what was landed, what the tables hold, what the commits say they wrote,
what was published — each read its own way, so that a classification, MERGE or publishing bug shows up.

- Landed: every record of every committed batch, read in plain Python from the landing (`onceflow.jobs.verify.landed`;
  a batch whose source no longer holds its input from its manifest, else counted as not re-checkable): its ID and
  event time, kept as Arrow columns. Duplicates are measured here: every occurrence of an ID after those
  the tables keep. The counting is column-wise (`onceflow.jobs.verify.id_accounting`).
- Tables: raw, dead letters and the window table read with delta-rs (a second engine), and the metrics of the
  source's own commits from the Delta log.
- Published: the file sink's pane files, parsed as JSON lines.

Source-wide: no landed ID is missing from both raw and the dead letters (lost); no ID is twice in raw (under
`exactly_once`) or twice in the dead letters (doubled); the rows the commits say they inserted are the rows the
tables hold. Per window (`unassigned` for records without a usable event time):

    received (landed) = inserted + late (raw rows, by batch vs. the close) + dead-lettered (dead-letter rows)
                        + duplicates (landed)

then a closed window's rows equal the transform of raw at its pinned version (Spark recomputes it), its final pane
is published (commit sequence done) and the published files hold exactly the window table's rows.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from onceflow.jobs.declare.declaration import WindowedOutput
from onceflow.jobs.delta.commit_log import rows_appended
from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.pane_sequence import pane_prefix
from onceflow.jobs.publish.sequence import sequence_id
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.jobs.verify.id_accounting import UNASSIGNED, later_occurrences, missing, per_window, repeated
from onceflow.jobs.verify.landed import LandedAccount
from onceflow.jobs.verify.tables import epoch_ms_columns, exists, table_ids
from onceflow.jobs.windows.panes import CloseStore, PaneClose, Window
from onceflow.jobs.windows.transform import pane_frame
from onceflow.resources.delta_storage import delta_table
from onceflow.resources.object_store import open_store


@dataclass(frozen=True)
class WindowReconciliation:
    """One window's accounting; `window` is its partition key, or `unassigned`."""

    window: str
    received: int
    inserted: int
    duplicates: int
    late: int
    dead_lettered: int
    closed: bool = False
    pane: int | None = None
    output_rows: int = 0
    output_matches: bool = True
    published: bool = False
    published_matches: bool = True
    late_policy: str = "drop"

    @property
    def balanced(self) -> bool:
        return self.received == self.inserted + self.duplicates + self.late + self.dead_lettered

    @property
    def ok(self) -> bool:
        if self.window == UNASSIGNED or not self.closed:
            return self.balanced  # an open window's early pane may lag the raw table
        # Under `refire`, rows after the newest pane's close are a pane still owed (a refire never asked for).
        refired = self.late_policy != "refire" or self.late == 0
        return self.balanced and self.output_matches and self.published and self.published_matches and refired


@dataclass
class SourceReconciliation:
    """Source-wide facts: IDs landed but held nowhere, IDs held twice, commits that disagree with the tables; and
    `notes`, what the account could not read from the source (no failure)."""

    lost: list[str] = field(default_factory=list)
    doubled_raw: list[str] = field(default_factory=list)
    doubled_dead: list[str] = field(default_factory=list)
    metric_mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled_raw or self.doubled_dead or self.metric_mismatches)


def reconcile_source(source: SourceRuntime, account: LandedAccount) -> SourceReconciliation:
    raw, dead = table_ids(source.raw_path), table_ids(source.dead_letter_path)
    result = SourceReconciliation(lost=missing(account.records.column("record_id"), raw, dead), notes=account.summary())
    if source.pipeline.delivery == "exactly_once":
        result.doubled_raw = repeated(raw)
    result.doubled_dead = repeated(dead)
    for path, rows in ((source.raw_path, len(raw)), (source.dead_letter_path, len(dead))):
        written = _inserted_by_commits(path)
        if written is not None and written != rows:
            result.metric_mismatches.append(f"{path}: commits say {written} rows inserted, the table holds {rows}")
    return result


def reconcile(
    spark: SparkSession,
    source: SourceRuntime,
    output: WindowedOutput,
    closes: CloseStore,
    commits: CommitStore,
    windows_path: str,
    files_root: str | None,
    landed: pa.Table,
) -> list[WindowReconciliation]:
    """The reconciliation of every window of `output` that received records, in window order (`unassigned` last)."""
    size = output.window_s
    dead_ids = table_ids(source.dead_letter_path)
    kept_raw = table_ids(source.raw_path) if source.pipeline.delivery == "exactly_once" else None
    received = per_window(landed.column("event_time_ms"), size)
    duplicates = per_window(later_occurrences(landed, kept_raw, dead_ids).column("event_time_ms"), size)
    windows = {k: Window.from_partition_key(k, size) for k in received if k != UNASSIGNED}
    closed = {k: c for k, w in windows.items() if (c := closes.latest(w)) is not None}
    inserted, late = Counter(), Counter()
    raw = epoch_ms_columns(source.raw_path, ["event_time", "batch_id"])
    for (w, batch), n in per_window(raw.column("event_time"), size, raw.column("batch_id")).items():
        if w in closed and batch > closed[w].max_batch_id:
            late[w] += n
        else:
            inserted[w] += n
    dead = per_window(epoch_ms_columns(source.dead_letter_path, ["event_time"]).column("event_time"), size)
    table = _window_rows(windows_path)
    matches = _outputs_match(spark, source, output, windows_path, {windows[k]: c for k, c in closed.items()})
    results = []
    for w in sorted(received, key=lambda k: (k == UNASSIGNED, k)):
        close = closed.get(w)
        published = close is not None and _done(commits, sequence_id(output.asset, w, close.pane))
        files_match = close is None or files_root is None or (
            _published_rows(files_root, output.asset, w, close.pane) == table.get(w, [])
        )
        results.append(WindowReconciliation(
            w, received[w], inserted[w], duplicates[w], late[w], dead[w], close is not None,
            close.pane if close else None, len(table.get(w, [])), matches.get(w, True), published, files_match,
            output.late_policy,
        ))
    return results


def _inserted_by_commits(path: str) -> int | None:
    """Rows inserted by every commit of the table, from the Delta log's operation metrics."""
    if not exists(path):
        return None
    total = 0
    for commit in delta_table(path).history():
        metrics = commit.get("operationMetrics") or {}
        operation = commit.get("operation")
        if operation == "MERGE":
            total += int(metrics.get("numTargetRowsInserted", 0)) - int(metrics.get("numTargetRowsDeleted", 0))
        elif operation == "WRITE":
            total += rows_appended(metrics)
        elif operation not in ("CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES"):
            return None  # something else changed the table: the metrics no longer add up to its rows
    return total


def _window_rows(windows_path: str) -> dict[str, list[str]]:
    """Each window's rows in the window table, as canonical sorted JSON (the form the file sink writes)."""
    if not exists(windows_path):
        return {}
    table = delta_table(windows_path).to_pyarrow_table().to_pylist()
    rows: dict[str, list[str]] = {}
    for row in table:
        key = Window.at(int(row["window_start"].timestamp() * 1000), 60).key  # any size: a start is a start
        rows.setdefault(key, []).append(canonical_row(row))
    return {k: sorted(v) for k, v in rows.items()}


def _published_rows(files_root: str, asset: str, window: str, pane: int) -> list[str]:
    store = open_store(files_root)
    prefix = pane_prefix(asset, window, pane)
    lines = []
    for key in store.list(prefix):
        if key.rsplit("/", 1)[-1].startswith("part-"):
            lines += [canonical_row(json.loads(line)) for line in (store.read(key) or b"").decode().splitlines()]
    return sorted(lines)


def canonical_row(row: dict) -> str:
    """A row as comparable text: timestamps as epoch ms, numbers as exact decimals, whatever form they came in."""

    def value(v: object) -> object:
        if isinstance(v, datetime):
            return int(v.timestamp() * 1000)
        if isinstance(v, str) and v.endswith("Z") and "T" in v:
            return int(datetime.fromisoformat(v).timestamp() * 1000)
        if isinstance(v, int | float | Decimal | str) and not isinstance(v, bool):
            try:
                return str(Decimal(str(v)).normalize())
            except ArithmeticError:
                return v
        return v

    return json.dumps({k: value(v) for k, v in sorted(row.items())}, sort_keys=True, default=str)


def _done(commits: CommitStore, seq: str) -> bool:
    return commits.get(seq) is not None and commits.state(seq).status == DONE


def _outputs_match(
    spark: SparkSession, source: SourceRuntime, output: WindowedOutput, windows_path: str,
    closed: dict[Window, PaneClose],
) -> dict[str, bool]:
    """Per closed window: do its rows equal the transform recomputed from raw at the pane's version?"""
    if not closed or not exists(windows_path):
        return {}
    table = spark.read.format("delta").load(windows_path)
    by_version: dict[int, list[tuple[Window, int, str]]] = {}
    for window, close in closed.items():
        by_version.setdefault(close.raw_version, []).append((window, close.pane, close.timing))
    differing: set[int] = set()
    for version, panes in by_version.items():
        _, expected = pane_frame(spark, source.pipeline, output, source.raw_path, version, panes)
        mine = table.filter(F.col("window_start").isin(*[F.timestamp_millis(F.lit(w.start_ms)) for w, _, _ in panes]))
        mine = mine.select(*expected.columns)  # by name: EXCEPT ALL compares by position
        diff = expected.exceptAll(mine).unionByName(mine.exceptAll(expected))
        differing |= {int(r["s"]) for r in diff.select(F.expr("unix_millis(window_start) AS s")).distinct().collect()}
    return {w.key: w.start_ms not in differing for w in closed}


def render(rows: list[WindowReconciliation]) -> str:
    """The reconciliation as a table, one line per window."""
    header = (f"{'window':<17} {'received':>8} {'inserted':>8} {'dupes':>6} {'late':>5} {'dead':>5} "
              f"{'rows':>7} {'pane':>5} {'published':>9}  ok")
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.window:<17} {r.received:>8} {r.inserted:>8} {r.duplicates:>6} {r.late:>5} {r.dead_lettered:>5} "
            f"{r.output_rows:>7} {r.pane if r.pane is not None else '-':>5} {'yes' if r.published else 'no':>9}  "
            f"{'ok' if r.ok else 'MISMATCH'}"
        )
    return "\n".join(lines)
