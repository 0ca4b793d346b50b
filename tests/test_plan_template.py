"""A batch's plan analysed once per pipeline and bound to each batch (`onceflow.jobs.ingest.plan_template`): each
bound plan reads exactly as the plan built for its batch, with that batch's rows and numbers."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.ingest.batch_ingest import _bucketed, _classified, _template
from onceflow.jobs.ingest.validation import batch_numbers

AT_MS = 1_795_000_000_000
HOUR_MS = 3_600_000


def _landed(spark: SparkSession, lines: list[str], first: int) -> DataFrame:
    return spark.createDataFrame(
        [(first + i, f"f.jsonl:{first + i}", None, None, line.encode()) for i, line in enumerate(lines)],
        "ordinal BIGINT, source_position STRING, publish_time TIMESTAMP, attributes MAP<STRING, STRING>, data BINARY",
    )


@pytest.mark.engine_paths
def test_a_batch_bound_to_its_pipelines_analysed_plan_reads_as_the_plan_built_for_it(spark: SparkSession) -> None:
    contract = RecordContract(schema=parse_schema("f STRING, d DECIMAL(6,2)"), max_record_bytes=10_000,
                              max_clock_skew_ms=HOUR_MS, id_field="id", time_field="at")
    old = AT_MS - 3 * HOUR_MS
    lines = [f'{{"id": "a", "at": {old}, "f": "x", "d": "1.5"}}', f'{{"id": "b", "at": {AT_MS}, "d": "1.234"}}',
             f'{{"id": "c", "at": {AT_MS + 2 * HOUR_MS}}}', '{"id": "d", "at": "yesterday"}']
    # The second batch is two hours later: its horizon floor leaves the first line behind, its clock takes the third.
    batches = [(0, AT_MS, AT_MS - 4 * HOUR_MS), (1 << 40, AT_MS + 2 * HOUR_MS, AT_MS - 2 * HOUR_MS)]
    reasons = [[None, "flagged", "event_time_out_of_range", "bad_event_time"],
               ["beyond_dedup_horizon", "flagged", None, "bad_event_time"]]
    _template.cache_clear()
    for (first, batch_time, floor), expected in zip(batches, reasons, strict=True):
        numbers = batch_numbers(contract, batch_time, floor, batch_id=first + 7, _ingested_ms=batch_time)
        landed = _landed(spark, lines, first)
        got = _classified(spark, landed, contract, HOUR_MS, True, numbers).orderBy("ordinal").toArrow()
        built = _bucketed(landed, numbers, contract=contract, bucket_ms=HOUR_MS, with_floor=True)
        assert got.equals(built.orderBy("ordinal").toArrow())
        assert got["reason"].to_pylist() == expected
        assert got["batch_id"].to_pylist() == [first + 7] * 4
        assert got["ordinal"].to_pylist() == [first + i for i in range(4)]
    # A classic session analysed the plan once, for both batches; Spark Connect's server analyses each batch's.
    assert _template.cache_info().currsize == (1 if hasattr(spark, "_jsparkSession") else 0)
