"""End to end with a real Dagster instance and a real `dagster-daemon`: the sensors drive everything.

Events are published continuously for about two minutes; one micro-batch run's process is killed with SIGKILL in
the middle of its batch; at the end the window table (read with delta-rs) equals the expected result exactly,
every window reconciles and is published.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.windows import Window
from orchestration.demo import run_streaming
from resources.spark_connect import SparkConnectServer
from tests.conftest import require
from tests.delta_reader import read_rows


def onceflow(command: str, home: Path, spark_connect: SparkConnectServer) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_", "SPARK_", "PUBSUB_"))}
    env.update(ONCEFLOW_HOME=str(home), ONCEFLOW_SPARK_REMOTE=spark_connect.url)
    return subprocess.run([sys.executable, "-m", "orchestration.cli", command], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sensors_drive_exactly_once_through_a_killed_run(spark_connect: SparkConnectServer, spark: SparkSession) -> None:
    require(shutil.which("java") is not None, "Java 17")
    require(shutil.which("gcloud") is not None, "the Google Cloud CLI's Pub/Sub emulator")
    result = run_streaming(duration_s=120, rate=15, timeout_s=720, keep=True, spark_remote=spark_connect.url)
    try:
        assert result.killed_run is not None
        expected = sorted(
            (datetime.fromtimestamp(Window.from_partition_key(w, 60).start_ms / 1000, UTC), key, count, total, 1)
            for w in result.windows
            for key, (count, total) in result.expected.counts(w).items()
        )
        rows = read_rows(str(result.home / "lake" / "windows" / "event_counts"),
                         ["window_start", "key", "count", "sum_value", "pane"])
        assert rows == expected
        assert sum(result.expected.late.values()) == 20  # the late events were published, and not counted
        assert result.ok

        status = onceflow("status", result.home, spark_connect)
        assert status.returncode == 0, status.stderr[-2000:]
        for window in result.windows:
            assert f"{window}  pane 1 (on_time)" in status.stdout and "published" in status.stdout
        assert "commit sequences: 0 pending, 0 quarantined" in status.stdout
        verify = onceflow("verify", result.home, spark_connect)
        assert verify.returncode == 0 and "events: exactly-once holds" in verify.stdout, verify.stdout + verify.stderr

        # A record lost from the raw table is caught: its window no longer balances.
        raw = result.home / "lake" / "raw" / "events"
        lost = next(iter(result.expected.on_time[result.windows[1]]))
        spark.sql(f"DELETE FROM delta.`{raw}` WHERE record_id = '{lost}'")
        verify = onceflow("verify", result.home, spark_connect)
        assert verify.returncode == 1 and f"MISMATCH in {result.windows[1]}" in verify.stdout, verify.stdout
        assert f"1 record IDs lost (landed, held nowhere): {lost}" in verify.stdout
    finally:
        shutil.rmtree(result.home.parent, ignore_errors=True)
