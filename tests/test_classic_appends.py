"""Appends committed by delta-rs with the SetTransaction (classic Spark sessions): exactly once, raced or replayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_a_raced_append_of_one_batch_commits_once_and_other_sources_still_commit(tmp_path: Path) -> None:
    # A classic session of its own (this process's Connect client leaves SPARK_CONNECT_MODE_ENABLED behind).
    env = {k: v for k, v in os.environ.items()
           if k not in ("ONCEFLOW_SPARK_REMOTE", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    path = str(tmp_path / "t")
    done = subprocess.run([sys.executable, "-m", "tests.classic_appends", path], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert (seen["first"], seen["replay"]) == (True, False)
    assert seen["same_batch"] == "conflict"  # the loser read the table before the winner committed batch 2
    assert seen["other_source"] == "committed"
    # Written for the table before a constraint was added: not committed; written again, the constraint holds.
    assert (seen["redefined"], seen["redefined_retry"]) == ("conflict", "violation")
    expected = [f"r{i:04d}" for i in [*range(0, 150), *range(300, 310), *range(400, 410)]]
    assert seen["ids"] == expected  # the loser's rows 200-249 are nowhere; nothing twice
    assert seen["spark_count"] == len(expected)
    assert seen["versions"] == {"a": 3, "b": 1}
    assert seen["metrics_of_batch_1"]["numOutputRows"] == "100"
