"""Run the benchmarks: `python -m bench.run [--only NAME] [--events N] [--rounds N]` (`make bench`).

Each benchmark writes `bench/results/<name>.json` and a chart `bench/results/<name>.png`. All benchmarks share
one Spark session, started before any timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench import ingest_throughput
from resources.spark import build_spark_session

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Benchmark:
    name: str
    run: Callable[[SparkSession, argparse.Namespace], dict[str, Any]]
    chart: Callable[[dict[str, Any], Path], None]


def _ingest_throughput(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    defaults = ingest_throughput.Config()
    config = ingest_throughput.Config(
        events=args.events or defaults.events, rounds=args.rounds or defaults.rounds
    )
    return ingest_throughput.run(spark, config)


BENCHMARKS: list[Benchmark] = [
    Benchmark(ingest_throughput.NAME, _ingest_throughput, ingest_throughput.chart),
]


def machine() -> dict[str, Any]:
    import pyspark

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "load_avg": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", choices=[b.name for b in BENCHMARKS], action="append", help="run only these"
    )
    parser.add_argument("--events", type=int, help="events per benchmark (default: each benchmark's own)")
    parser.add_argument("--rounds", type=int, help="timed rounds per mode (default: each benchmark's own)")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help=f"output directory (default: {RESULTS})"
    )
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-warehouse-") as warehouse:
        spark = build_spark_session(
            app_name="onceflow-bench",
            conf={"spark.sql.warehouse.dir": warehouse, "spark.driver.memory": "2g"},
        )
        try:
            for bench in BENCHMARKS:
                if args.only and bench.name not in args.only:
                    continue
                print(f"== {bench.name}", flush=True)
                started = time.time()
                result = {
                    **bench.run(spark, args),
                    "started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
                    "elapsed_s": round(time.time() - started, 1),
                    "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *sys.argv[1:]]),
                    "machine": machine(),
                }
                json_path, png_path = args.results / f"{bench.name}.json", args.results / f"{bench.name}.png"
                json_path.write_text(json.dumps(result, indent=2) + "\n")
                bench.chart(result, png_path)
                print(f"wrote {json_path} and {png_path}", flush=True)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
