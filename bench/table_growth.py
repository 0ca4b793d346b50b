"""Ingest time per batch as the raw table grows 10x (DESIGN.md section 10, benchmark 2). Not written yet.

`bench.run` calls `table_growth(spark, args)` once, after the throughput rounds, on the same Spark session, and
stores what it returns under `table_growth` in `bench/results/latest.json` (`null` for None).
"""

from __future__ import annotations

import argparse
from typing import Any

from pyspark.sql import SparkSession


def table_growth(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any] | None:
    """The JSON-ready result of the benchmark; None until it is implemented."""
    return None
