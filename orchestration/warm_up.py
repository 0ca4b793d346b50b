"""A freshly started Spark engine's warm-up: two small batches through the path every micro-batch takes.

A new engine's JVM has compiled nothing yet: the first batch a run sends it spends seconds being analysed, planned
and compiled (about 5 s more than on a warm engine, for 233 Pub/Sub messages on 2 cores). `warm_engine` has a
process of its own (a Spark Connect client, as every run is) ingest a scratch file pipeline into a scratch home,
exactly once, with a publisher retry and a malformed line among its records, then removes both: the first batch
of a real source then finds the engine warm. Nothing of it reaches a user's lake.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from onceflow.orchestration.checkout import PROJECT_ROOT
from onceflow.resources.spark_connect import on_this_machine

RECORDS = 40
BATCHES = 2


class WarmUpError(RuntimeError):
    """The engine could not ingest the warm-up batches: it cannot run a micro-batch either."""


def warm_engine(remote: str, master: str, timeout_s: float = 300.0) -> float | None:
    """Warm the Spark Connect engine at `remote`, driving `master` (see the module docstring); the seconds it took,
    or None where the master's executors run on other machines (they cannot read the scratch files)."""
    if not on_this_machine(master):
        return None
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", __name__, remote], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise WarmUpError(f"the Spark engine at {remote} failed its warm-up batch: {done.stderr[-3000:]}")
    return time.monotonic() - started


def _write_records(directory: Path) -> None:
    now_ms = int(time.time() * 1000)
    for batch in range(BATCHES):
        lines = [json.dumps({"event_id": f"w{batch}-{n}", "event_time": now_ms - n, "key": f"k{n % 3}",
                             "value": f"{n}.5"}) for n in range(RECORDS)]
        lines += [lines[0], '{"event_id": "broken", "event_time": ']  # a retry, a malformed line
        (directory / f"{batch}.jsonl").write_text("\n".join(lines) + "\n")


def _ingest(remote: str) -> None:
    from onceflow.jobs.declare.declaration import Pipeline
    from onceflow.jobs.declare.sources import FileSource
    from onceflow.jobs.ingest.micro_batch import run_micro_batch
    from onceflow.jobs.sources.reader import open_source
    from onceflow.orchestration.pipelines import resolve
    from onceflow.resources.lake import LakeResource
    from onceflow.resources.settings import load_settings
    from onceflow.resources.spark import build_spark_session

    scratch = Path(tempfile.mkdtemp(prefix="onceflow-warm-up-"))
    try:
        (scratch / "in").mkdir()
        _write_records(scratch / "in")
        source = FileSource(directory=str(scratch / "in"), id_field="event_id", timestamp_field="event_time",
                            max_files=1)
        pipeline = resolve(Pipeline(name="warm_up", source=source, schema="key STRING, value DECIMAL(18, 2)"),
                           load_settings())
        runtime = open_source(pipeline, LakeResource(home=str(scratch / "home")))
        spark = build_spark_session(remote=remote)
        results = [run_micro_batch(lambda: spark, runtime) for _ in range(BATCHES)]
        if any(r is None or r.inserted != RECORDS for r in results):
            raise WarmUpError(f"the warm-up batches did not ingest {RECORDS} records each: {results}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    _ingest(sys.argv[1])
