"""The chaos harness's short run on the local profile: `CHAOS_ITERATIONS` (default 5) overlapping faults under a
continuous workload, then lost 0, duplicated 0 and every window reconciled. `make test-chaos` (CI, after `make
test`) runs it on both engine paths, each a whole stack of its own, and once more on Spark Connect with the `events`
pipeline on a Kafka topic (`CHAOS_SOURCE=kafka`: Kafka's reader plans, and reads ahead, on rules of its own);
`make chaos` runs 30 faults on each path, and `CHAOS_PROFILE=cluster-gcs make chaos` on the cluster profile (on two
cores its runs take too long for CI).

The harness runs in a process of its own: its account reads with a Spark session of the path it proves, and a
process holds one kind of session.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from onceflow.orchestration.local_stack import PROJECT_ROOT
from tests.conftest import require


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(1800)
def test_exactly_once_under_overlapping_faults(engine_path: str) -> None:
    require(shutil.which("java") is not None, "Java 17")
    require(shutil.which("gcloud") is not None, "the Google Cloud CLI's Pub/Sub emulator")
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    iterations = os.environ.get("CHAOS_ITERATIONS", "5")  # the harness starts its own engine, if any
    source = os.environ.get("CHAOS_SOURCE", "pubsub")
    env = {k: v for k, v in os.environ.items() if k not in ("ONCEFLOW_SPARK_REMOTE", "SPARK_REMOTE",
                                                            "SPARK_CONNECT_MODE_ENABLED")}
    run = subprocess.run(
        [sys.executable, "-m", "tests.chaos.harness", "--iterations", iterations, "--seed", str(seed),
         "--publish-s", "40", "--engine", engine_path, "--profile", "local", "--source", source],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=2300,
    )
    print(run.stdout[-6000:])
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"{summary}\n{run.stdout[-4000:]}\n{run.stderr[-12000:]}"
    found = re.search(rf"chaos seed {seed} on the {engine_path} engine path, local profile: (\d+) faults .* "
                      rf"\((\d+) records, \d+ malformed\) over 2 pipelines \(events on {source}\).* "
                      r"lost 0, duplicated 0; 0 other problems", summary)
    assert found, summary
    assert int(found.group(1)) >= 1 and int(found.group(2)) > 0, summary
