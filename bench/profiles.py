"""Exactly-once ingest on the two deployment profiles, one after the other on the same files (DESIGN section 11:
what `cluster-gcs` costs against `local`).

A process has one SparkContext, so each profile drains in a process of its own (`python -m bench.profiles
PROFILE ...`): `local` is a `local[2]` classic session with the home on local disk; `cluster-gcs` a classic
session whose master is a standalone cluster of two one-core workers started from the pyspark wheel
(`onceflow.resources.spark_cluster`), with the whole home on the GCS emulator (`onceflow.resources.emulators.gcs`;
Spark writes through the GCS connector, delta-rs commits and reads the log over HTTP). Each writes the clean data
set's files (seeded: the same files), makes a discarded warm-up drain, then `--profile-rounds` timed drains with
`bench.ingest_throughput.drain_once`, each into a fresh home, checked as the throughput benchmark checks them.
Only the drains are timed (not the servers' start, not the files).

Here the cluster's master, workers and executors, the emulator and the driver share the same two cores, and
every request to storage is a loopback round trip: `cluster_over_local` is what the profile costs on one small
machine, not the speed-up a real cluster of real machines gives.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.datasets import CLEAN, BenchmarkError, Source
from bench.ingest_throughput import check, drain_once
from onceflow.resources.emulators.gcs import start_gcs_emulator
from onceflow.resources.spark import build_spark_session
from onceflow.resources.spark_cluster import start_spark_cluster

PROFILES = ("local", "cluster-gcs")
EVENTS = 40_000
ROUNDS = 2
FILES, FILES_PER_BATCH = 10, 2


def drain_profile(profile: str, events: int, rounds: int) -> dict[str, Any]:
    """In this process: start the profile's servers, drain `rounds` timed times after a warm-up; the runs."""
    work = Path(tempfile.mkdtemp(prefix=f"onceflow-bench-{profile}-"))
    with ExitStack() as stack:
        master, homes = "local[2]", None
        if profile == "cluster-gcs":
            gcs = start_gcs_emulator()
            stack.callback(gcs.stop)
            bucket = f"bench-{uuid.uuid4().hex[:10]}"
            gcs.create_bucket(bucket)
            os.environ.update(STORAGE_EMULATOR_HOST=gcs.host, ONCEFLOW_HOME=f"gs://{bucket}/home",
                              SPARK_LOCAL_IP="127.0.0.1")
            cluster = start_spark_cluster()
            stack.callback(cluster.stop)
            master, homes = cluster.master_url, f"gs://{bucket}"
        spark = build_spark_session(  # on a gs:// home with the emulator's settings (`with_gcs_settings`)
            master=master, app_name=f"onceflow-bench-{profile}",
            conf={"spark.sql.warehouse.dir": str(work / "warehouse"), "spark.driver.memory": "2g"},
        )
        stack.callback(spark.stop)
        source = Source.write(CLEAN, work / "source", events, FILES, FILES_PER_BATCH)
        runs = []
        for round_no in range(rounds + 1):
            home = None if homes is None else f"{homes}/home-{round_no}"
            run = drain_once(spark, source, "exactly_once", work, round_no, home=home)
            check(run, source)
            print(f"profiles {profile} round {round_no}{' (warm-up, discarded)' if not round_no else ''}: "
                  f"{run.records_per_s:,.0f} records/s", flush=True)
            if round_no:
                runs.append(asdict(run))
    return {"profile": profile, "master": master, "home": homes or "local disk", "runs": runs,
            "records_per_s": statistics.median(r["received"] / r["seconds"] for r in runs)}


def profiles(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-ready result: each profile drained in a process of its own, one after the other."""
    events: int = getattr(args, "profile_events", None) or EVENTS
    rounds: int = getattr(args, "profile_rounds", None) or ROUNDS
    measured = {}
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-profiles-") as tmp:
        for profile in PROFILES:
            out = Path(tmp) / f"{profile}.json"
            done = subprocess.run([sys.executable, "-m", "bench.profiles", profile, str(events), str(rounds), str(out)],
                                  check=False)
            if done.returncode or not out.exists():
                raise BenchmarkError(f"profiles: the {profile} drain failed (exit {done.returncode})")
            measured[profile] = json.loads(out.read_text())
    return {
        "cluster_over_local": measured["cluster-gcs"]["records_per_s"] / measured["local"]["records_per_s"],
        "profiles": measured,
        "config": {"events": events, "rounds": rounds, "files": FILES, "files_per_batch": FILES_PER_BATCH,
                   "data_set": CLEAN.name, "delivery": "exactly_once", "engine_path": "classic",
                   "cluster": "standalone, 2 workers of 1 core and 1 GiB, on this machine",
                   "timed": "each drain of the whole source (run_micro_batch until no batch)"},
    }


if __name__ == "__main__":
    name, count, timed, result = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    result.write_text(json.dumps(drain_profile(name, count, timed), default=str))
