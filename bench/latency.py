"""Latency from publish to committed window output, and from sensor tick to committed micro-batch (DESIGN.md
section 10, benchmark 4). Not written yet.

`bench.run` calls `latency(spark, args)` once, after the throughput rounds, on the same Spark session, and stores
what it returns under `latency` in `bench/results/latest.json` (`null` for None).
"""

from __future__ import annotations

import argparse
from typing import Any

from pyspark.sql import SparkSession


def latency(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any] | None:
    """The JSON-ready result of the benchmark; None until it is implemented."""
    return None
