"""The reader of a `FileSource`: a directory of JSON-lines files, planned by fingerprint before it is read.

The next batch's plan lists its files (path, size, SHA-256) before any of them is read, so a replay reads exactly
the same bytes and a file that changed since is an error naming it. A batch's files are read
(`landed`): each non-empty line is one record at position `<relative path>:<byte offset>`.
"""

from __future__ import annotations

import time

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from jobs.declaration import FileSource, Pipeline
from jobs.durations import parse_duration
from jobs.landed_ids import LandedRow
from jobs.landing import LANDING_SCHEMA, BatchOutcome
from jobs.watermark import FileWatermark, WatermarkEstimator
from resources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint
from resources.files import JsonLinesDirectory


class FileReader:
    """See the module docstring; `pipeline.source` is a settings-resolved `FileSource`."""

    def __init__(self, pipeline: Pipeline, checkpoints: CheckpointStore) -> None:
        source = pipeline.source
        if not isinstance(source, FileSource) or source.max_files is None:
            raise TypeError("FileReader needs a settings-resolved FileSource")
        self.pipeline, self.source, self.checkpoints = pipeline, source, checkpoints
        self.directory = JsonLinesDirectory(source.directory, source.pattern)

    def has_data(self, checkpoint: SourceCheckpoint) -> bool:
        return bool(self.directory.discover(set(checkpoint.taken_files), 1, 1))

    def next_plan(self, checkpoint: SourceCheckpoint, horizon_floor_ms: int | None) -> BatchPlan | None:
        plan = self.checkpoints.get_plan(checkpoint.next_batch)
        if plan is not None:
            return plan
        assert self.source.max_files is not None
        files = self.directory.discover(set(checkpoint.taken_files), self.source.max_files, self.source.max_bytes)
        if not files:
            return None
        return self.checkpoints.plan(
            BatchPlan(
                batch_id=checkpoint.next_batch,
                kind="files",
                horizon_floor_ms=horizon_floor_ms,
                planned_at_ms=int(time.time() * 1000),
                files=tuple(files),
            )
        )

    def landed(self, spark: SparkSession, plan: BatchPlan) -> DataFrame:
        rows = self.landed_rows(plan)
        table = pa.table(
            {
                "ordinal": list(range(len(rows))),
                "source_position": [r.position for r in rows],
                "publish_time": pa.nulls(len(rows), pa.timestamp("ms", tz="UTC")),
                "attributes": pa.nulls(len(rows), pa.map_(pa.string(), pa.string())),
                "data": [r.data for r in rows],
            },
            schema=LANDING_SCHEMA,
        )
        return spark.createDataFrame(table)

    def landed_count(self, plan: BatchPlan) -> int:
        return sum(1 for entry in plan.files for _ in self.directory.lines(entry))

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

    def ensure(self) -> str:
        self.directory.directory.mkdir(parents=True, exist_ok=True)
        return f"directory {self.directory.directory}"

    def backlog(self, checkpoint: SourceCheckpoint) -> str:
        return f"{len(self.directory.discover(set(checkpoint.taken_files), 10**9, 2**62))} new files"
