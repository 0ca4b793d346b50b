"""The chaos harness's short run, part of `make test`: `CHAOS_ITERATIONS` (default 5) overlapping faults under a
continuous workload, then lost 0, duplicated 0 and every window reconciled. `make chaos` runs 30."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from tests.chaos.harness import run_chaos
from tests.conftest import require


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_exactly_once_under_overlapping_faults() -> None:
    require(shutil.which("java") is not None, "Java 17")
    require(shutil.which("gcloud") is not None, "the Google Cloud CLI's Pub/Sub emulator")
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    iterations = int(os.environ.get("CHAOS_ITERATIONS", "5"))
    report = run_chaos(iterations, seed, publish_s=40.0)
    print(report.summary())
    assert report.ok, "\n".join([report.summary(), *report.problems[:20], *report.lost[:20], *report.duplicated[:20]])
    assert sum(report.faults.values()) >= 1 and report.records > 0
