"""The reader of a `FileSource`: a directory of JSON-lines files, planned by fingerprint before it is read.

The next batch's plan lists its files (path, size, SHA-256) before any of them is read, so a replay reads exactly
the same bytes and a file that changed since is an error naming it. A batch's files are read by Spark's executors
(`landed`), never through the driver: each non-empty line is one record at position `<relative path>:<byte
offset>`, its bytes exactly as in the file (a line's trailing CR dropped).
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.durations import parse_duration
from onceflow.jobs.declare.sources import FileSource
from onceflow.jobs.sources.batch_values import batch_value
from onceflow.jobs.sources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint, planned_contract
from onceflow.jobs.sources.landed_ids import LandedRow
from onceflow.jobs.sources.landing import STREAM_STRIDE, BatchOutcome
from onceflow.jobs.sources.watermark import FileWatermark, WatermarkEstimator
from onceflow.resources.files import JsonLinesDirectory
from onceflow.resources.plan_template import BatchValues, PlanTemplate


class UnlistedFileError(RuntimeError):
    """Spark's listing of a batch's files does not name one of them (it cannot be told apart from the others)."""


def _listed_uris(listed: list[str], paths: list[str]) -> list[str]:
    """Spark's URIs of the files at `paths` (from `listed`, the URIs of a text scan of them), in the order of
    `paths`."""
    # Spark names a line's file by a URI of its own spelling (some characters escaped): the one it listed, where
    # a local file is `file:/path` (the listing writes `file:///path`).
    by_path = {os.path.normpath(unquote(urlparse(uri).path)): re.sub("^file:///", "file:/", uri) for uri in listed}
    uris = [by_path.get(os.path.normpath(path)) for path in paths]
    missing = [path for path, uri in zip(paths, uris, strict=True) if uri is None]
    if missing:
        raise UnlistedFileError(f"Spark's listing of the batch's files does not name {missing}")
    return [uri for uri in uris if uri is not None]


def _landing(scan: DataFrame, values: BatchValues) -> DataFrame:
    """The landing of a batch's files from their text scan (`value`, `file_path`, `block`: the start of the line's
    file split) and the batch's values `uris` (Spark's URIs of its files, in the plan's order) and `relative`
    (their paths in the source directory): every line that is not blank, with its file's index (a stream per
    file) and its byte offset in that file."""
    spark = scan.sparkSession
    uris, relative = batch_value(spark, "uris", values["uris"]), batch_value(spark, "relative", values["relative"])
    position = f"array_position({uris}, file_path)"
    # SQL text: each column built in Python costs round trips to the JVM.
    located = scan.selectExpr(
        "value",
        f"CAST(CASE WHEN {position} > 0 THEN {position} - 1 ELSE raise_error('a line of a file not in the batch') END"
        " AS INT) AS file",
        "block",
    )
    lines = located.selectExpr("value", "file", f"{_line_offsets(uris)} AS offset")
    # A blank line (as the driver's count sees one: only ASCII whitespace) is skipped. The pattern is tried only
    # on a line that starts as a blank one does: it decodes the whole line to a Java string first.
    blank = ("value = '' OR left(value, 1) IN (' ', chr(9), chr(11), chr(12), chr(13)) AND "
             r"value RLIKE '^[ \\t\\r\\x0B\\f]*$'")
    return lines.filter(f"NOT ({blank})").selectExpr(
        f"CAST(file AS BIGINT) * {STREAM_STRIDE} + offset AS ordinal",  # a stream per file
        f"concat(element_at({relative}, file + 1), ':', offset) AS source_position",
        "CAST(NULL AS TIMESTAMP) AS publish_time",
        "CAST(NULL AS MAP<STRING, STRING>) AS attributes",
        # Only a line that ends in CR is trimmed: trimming scans the whole line.
        "CAST(CASE WHEN endswith(value, chr(13)) THEN trim(TRAILING chr(13) FROM value) ELSE value END AS BINARY)"
        " AS data",
    )


def _located(lines: DataFrame) -> DataFrame:
    """A text scan's lines with their file and where the file's split starts (what `_landing` reads)."""
    return lines.selectExpr("value", "_metadata.file_path AS file_path", "_metadata.file_block_start AS block")


@functools.lru_cache(maxsize=8)
def _landing_template(spark: SparkSession, scan_schema: T.StructType, settings: str) -> PlanTemplate:
    """`_landing`'s plan, analysed once in the classic session `spark` under its `settings` (a digest of them)."""
    return PlanTemplate(spark, scan_schema, _landing, {"uris": [""], "relative": [""]})


def _line_offsets(uris: str) -> str:
    """SQL for the byte offset in its file of each line of a text scan of the files at `uris` (SQL for Spark's URIs
    of them; columns `value`, `file` and `block`): summed as the lines are read, by `onceflow_line_offset`
    (`LineOffsets.java`, beside this module; registered by `onceflow.resources.spark_functions`)."""
    # The URI is needed (and made) only where a split starts inside a file; the executor opens it as its scan did.
    uri = f"CASE WHEN block > 0 THEN element_at({uris}, file + 1) END"
    return f"onceflow_line_offset(file, block, CAST(octet_length(value) + 1 AS INT), {uri}, monotonically_increasing_id())"


class FileReader:
    """See the module docstring; `pipeline.source` is a settings-resolved `FileSource`."""

    reads_ahead = True

    def __init__(self, pipeline: Pipeline, checkpoints: CheckpointStore) -> None:
        source = pipeline.source
        if not isinstance(source, FileSource) or source.max_files is None:
            raise TypeError("FileReader needs a settings-resolved FileSource")
        self.pipeline, self.source, self.checkpoints = pipeline, source, checkpoints
        self.directory = JsonLinesDirectory(source.directory, source.pattern)

    def has_data(self, checkpoint: SourceCheckpoint) -> bool:
        return bool(self.directory.discover(set(checkpoint.taken_files), 1, 1))

    def next_plan(
        self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None, proposal: BatchPlan | None = None
    ) -> BatchPlan | None:
        plan = self.checkpoints.get_plan(checkpoint.next_batch)
        if plan is not None:
            return plan
        fresh = self.propose(checkpoint, horizon_floor_ms)
        if fresh is None:
            return None
        # The plan read ahead is this one when only its planning time differs: it was made a moment earlier.
        same = proposal is not None and proposal.model_copy(update={"planned_at_ms": fresh.planned_at_ms}) == fresh
        return self.checkpoints.plan(proposal if same else fresh)

    def propose(self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None) -> BatchPlan | None:
        assert self.source.max_files is not None
        files = self.directory.discover(set(checkpoint.taken_files), self.source.max_files, self.source.max_bytes)
        if not files:
            return None
        return BatchPlan(batch_id=checkpoint.next_batch, kind="files", horizon_floor_ms=horizon_floor_ms,
                         planned_at_ms=int(time.time() * 1000), files=tuple(files), contract=planned_contract(self.pipeline))

    def landed(self, spark: SparkSession, plan: BatchPlan) -> DataFrame:
        paths = [self.directory.path_of(entry) for entry in plan.files]
        relative = [entry.path for entry in plan.files]
        if not hasattr(spark, "_jsparkSession"):  # Spark Connect: its server analyses the plan
            # lineSep "\n" keeps a CR in the line (so byte offsets add up); the text source keeps the bytes as read.
            lines = spark.read.option("lineSep", "\n").text(paths)
            return _landing(_located(lines), {"uris": _listed_uris(lines.inputFiles(), paths), "relative": relative})
        scan = spark._jvm.io.onceflow.TextScan.of(spark._jsparkSession, json.dumps(paths))  # the same, read directly
        values = {"uris": _listed_uris(list(scan.uris()), paths), "relative": relative}
        lines = _located(DataFrame(scan.lines(), spark))
        return _landing_template(spark, lines.schema, PlanTemplate.settings(spark))(lines, values)

    def landed_count(self, plan: BatchPlan) -> int:
        # The driver reads each file once a batch, beside Spark's read of it (and before anything commits): to check
        # that it is the file planned, and to count its records.
        return sum(self.directory.count(entry) for entry in plan.files)

    def recount(self, plan: BatchPlan, counted: int) -> int:
        return counted

    def landed_rows(self, plan: BatchPlan) -> list[LandedRow]:
        return [
            LandedRow(f"{entry.path}:{offset}", None, line, None)
            for entry in plan.files for offset, line in self.directory.lines(entry)
        ]

    def watermark(self, state: dict) -> WatermarkEstimator:
        return FileWatermark(
            parse_duration(self.source.out_of_orderness) * 1000,
            idle_timeout_ms=parse_duration(self.pipeline.watermark_idle or "120s") * 1000,
        ).from_state(state)

    def before_batch(self, now_ms: int) -> None:
        return None

    def after_commit(
        self, watermark: WatermarkEstimator, plan: BatchPlan, outcome: BatchOutcome, now_ms: int
    ) -> None:
        assert isinstance(watermark, FileWatermark)
        watermark.observe(outcome.max_event_time_ms, now_ms)

    def after_checkpoint(self, plan: BatchPlan) -> None:
        return None

    def ensure(self) -> str:
        self.directory.directory.mkdir(parents=True, exist_ok=True)
        return f"directory {self.directory.directory}"

    def lag(self, plan: BatchPlan) -> dict[str, int]:
        return {}

    def backlog(self, checkpoint: SourceCheckpoint) -> str:
        return f"{len(self.directory.discover(set(checkpoint.taken_files), 10**9, 2**62))} new files"
