"""`onceflow engine`: a warm Spark engine (a Spark Connect server) on a given master, for processes to connect to.

Every short-lived process (a Dagster run, `onceflow status`) then connects to it instead of starting Spark
itself. The master is `--master` (default `ONCEFLOW_SPARK_MASTER`: `local[2]`, or a cluster's
`spark://host:port`), or, with `--cluster`, a standalone cluster of two workers the command starts on this
machine. `onceflow dev` starts the same engine for the Dagster UI and daemon.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from onceflow.orchestration.warm_up import warm_engine
from onceflow.resources.settings import load_settings
from onceflow.resources.spark_cluster import start_spark_cluster
from onceflow.resources.spark_connect import SparkConnectServer, start_engine


@contextmanager
def running_engine(
    master: str | None, cluster: bool, say: Callable[[str], None] = print
) -> Iterator[SparkConnectServer]:
    """A Spark Connect server on `master` (or on a standalone cluster it starts), stopped when the block ends."""
    stops: list[Callable[[], None]] = []
    try:
        if cluster:
            say("starting a Spark standalone cluster: a master and two workers on 127.0.0.1")
            started = start_spark_cluster()
            stops.append(started.stop)
            master = started.master_url
            say(f"Spark master {started.master_url} (web UI {started.web_url})")
        say(f"starting the Spark engine on {master or load_settings().spark_master}")
        server = start_engine(load_settings(), master)
        stops.append(server.stop)
        warmed = warm_engine(server.url, master or load_settings().spark_master)
        say("the engine's executors run elsewhere: no warm-up batches" if warmed is None else
            f"the engine ran its warm-up batches in {warmed:.1f} s")
        yield server
    finally:
        for stop in reversed(stops):
            stop()


def cmd_engine(args: argparse.Namespace) -> int:
    # A SIGTERM (from make, a supervisor) must still stop the engine and the cluster, not orphan them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with running_engine(args.master, args.cluster) as server:
        print(f"ONCEFLOW_SPARK_REMOTE={server.url}", flush=True)
        try:
            code = server.process.wait()
        except KeyboardInterrupt:
            return 0
    print(f"the Spark engine exited ({code}): {server.log_path}", file=sys.stderr)
    return 1


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--master", help="the engine's Spark master (default ONCEFLOW_SPARK_MASTER), e.g. spark://host:7077")
    group.add_argument("--cluster", action="store_true", help="start a two-worker standalone cluster here and use it")


def add_commands(sub: argparse._SubParsersAction) -> None:
    engine = sub.add_parser("engine", help="a warm Spark engine (Spark Connect) on a given master; prints its sc:// URL")
    add_engine_options(engine)
    engine.set_defaults(func=cmd_engine)
