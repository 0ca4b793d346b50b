"""A batch's plan analysed once per pipeline and bound to each batch (`onceflow.resources.plan_template`): each
bound plan reads exactly as the plan built for its batch, with that batch's rows and numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.ingest.batch_read import DRIVER_COLUMNS, _bucketed, _classified, _template
from onceflow.jobs.ingest.validation import batch_numbers
from onceflow.jobs.sources.checkpoint import BatchPlan
from onceflow.jobs.sources.file_reader import _landing, _landing_template, _listed_uris, _located
from onceflow.jobs.sources.reader import open_source
from onceflow.resources.files import fingerprint
from onceflow.resources.lake import LakeResource
from onceflow.resources.spark_functions import register_spark_functions
from tests.pipelines import builtin, events_from_files

AT_MS = 1_795_000_000_000
HOUR_MS = 3_600_000


def _landed(spark: SparkSession, lines: list[str], first: int) -> DataFrame:
    return spark.createDataFrame(
        [(first + i, f"f.jsonl:{first + i}", None, None, line.encode()) for i, line in enumerate(lines)],
        "ordinal BIGINT, source_position STRING, publish_time TIMESTAMP, attributes MAP<STRING, STRING>, data BINARY",
    )


@pytest.mark.engine_paths
@pytest.mark.parametrize("outputs", [(), (*DRIVER_COLUMNS, "record_id", "time_bucket", "batch_id", "ordinal")],
                         ids=["classified", "projected for the driver"])
def test_a_batch_bound_to_its_pipelines_analysed_plan_reads_as_the_plan_built_for_it(
    spark: SparkSession, outputs: tuple[str, ...]
) -> None:
    contract = RecordContract(schema=parse_schema("f STRING, d DECIMAL(6,2)"), max_record_bytes=10_000,
                              max_clock_skew_ms=HOUR_MS, id_field="id", time_field="at")
    old = AT_MS - 3 * HOUR_MS
    lines = [f'{{"id": "a", "at": {old}, "f": "x", "d": "1.5"}}', f'{{"id": "b", "at": {AT_MS}, "d": "1.234"}}',
             f'{{"id": "c", "at": {AT_MS + 2 * HOUR_MS}}}', '{"id": "d", "at": "yesterday"}']
    # The second batch is two hours later: its horizon floor leaves the first line behind, its clock takes the third.
    # The third has no floor (an at-least-once batch, or one before any watermark): the first line is kept.
    batches = [(0, AT_MS, AT_MS - 4 * HOUR_MS), (1 << 40, AT_MS + 2 * HOUR_MS, AT_MS - 2 * HOUR_MS),
               (2 << 40, AT_MS + 2 * HOUR_MS, None)]
    reasons = [[None, "flagged", "event_time_out_of_range", "bad_event_time"],
               ["beyond_dedup_horizon", "flagged", None, "bad_event_time"],
               [None, "flagged", None, "bad_event_time"]]
    _template.cache_clear()
    for (first, batch_time, floor), expected in zip(batches, reasons, strict=True):
        numbers = batch_numbers(contract, batch_time, floor, batch_id=first + 7, _ingested_ms=batch_time)
        landed = _landed(spark, lines, first)
        got = _classified(spark, landed, contract, HOUR_MS, numbers, outputs).orderBy("ordinal").toArrow()
        built = _bucketed(landed, numbers, contract=contract, bucket_ms=HOUR_MS, outputs=outputs)
        assert got.equals(built.orderBy("ordinal").toArrow())
        assert got["reason"].to_pylist() == expected
        assert got["batch_id"].to_pylist() == [first + 7] * 4
        assert got["ordinal"].to_pylist() == [first + i for i in range(4)]
    # A classic session analysed the plan once, for every batch; Spark Connect's server analyses each batch's.
    assert _template.cache_info().currsize == (1 if hasattr(spark, "_jsparkSession") else 0)


@pytest.mark.engine_paths
def test_batches_of_files_bound_to_the_analysed_landing_read_as_the_landing_built_for_each(
    spark: SparkSession, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = events_from_files(tmp_path, monkeypatch, max_files=2)
    (incoming / "sub").mkdir()
    (incoming / "a.jsonl").write_bytes(b'{"n": 1}\n\n  \t\n{"n": 2}\r\n')
    (incoming / "b.jsonl").write_bytes(b'{"n": 3}\n{"n": 4}')
    (incoming / "sub" / "c d%.jsonl").write_bytes(b'\x0b{"n": 5}\n{"n": 6}\n')
    source = open_source(builtin("events"), LakeResource(home=str(home)))
    register_spark_functions(spark)
    entries = {path: fingerprint(incoming, path) for path in ("a.jsonl", "b.jsonl", "sub/c d%.jsonl")}
    _landing_template.cache_clear()
    for batch, files in ((1, ["a.jsonl", "b.jsonl"]), (2, ["sub/c d%.jsonl", "a.jsonl"])):
        plan = BatchPlan(batch_id=batch, kind="files", horizon_floor_ms=None, planned_at_ms=AT_MS,
                         files=tuple(entries[f] for f in files))
        got = source.reader.landed(spark, plan).orderBy("ordinal").toArrow()
        paths = [str(incoming / f) for f in files]
        lines = spark.read.option("lineSep", "\n").text(paths)  # as a Spark user reads them
        built = _landing(_located(lines), {"uris": _listed_uris(lines.inputFiles(), paths), "relative": files})
        assert got.equals(built.orderBy("ordinal").toArrow())
        # Blank lines skipped, offsets in bytes, a stream per file in the plan's order, a CR dropped.
        expected = {1: [(0, "a.jsonl:0", b'{"n": 1}'), (14, "a.jsonl:14", b'{"n": 2}'),
                        (1 << 40, "b.jsonl:0", b'{"n": 3}'), ((1 << 40) + 9, "b.jsonl:9", b'{"n": 4}')],
                    2: [(0, "sub/c d%.jsonl:0", b'\x0b{"n": 5}'), (10, "sub/c d%.jsonl:10", b'{"n": 6}'),
                        (1 << 40, "a.jsonl:0", b'{"n": 1}'), ((1 << 40) + 14, "a.jsonl:14", b'{"n": 2}')]}
        assert list(zip(*(got[c].to_pylist() for c in ("ordinal", "source_position", "data")), strict=True)) == \
            expected[batch]
    assert _landing_template.cache_info().currsize == (1 if hasattr(spark, "_jsparkSession") else 0)
