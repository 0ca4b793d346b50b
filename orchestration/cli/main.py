"""The `onceflow` command line: set-up, the demo, the dev server, the warm Spark engine, status and verification."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from onceflow.orchestration.cli.commits import add_commands as add_commit_commands
from onceflow.orchestration.cli.engine import add_commands as add_engine_commands
from onceflow.orchestration.cli.engine import add_engine_options, running_engine
from onceflow.orchestration.cli.init import add_command as add_init_command
from onceflow.orchestration.cli.reset import add_commands as add_reset_commands
from onceflow.orchestration.cli.status import add_commands as add_status_commands
from onceflow.orchestration.instance import write_instance, write_workspace
from onceflow.resources.class_archive import ClassArchiveError, ensure_class_archive
from onceflow.resources.delta_jars import ensure_delta_jars, ensure_gcs_connector_jar
from onceflow.resources.emulators.kafka import ensure_kafka_broker_libs
from onceflow.resources.kafka_jars import ensure_spark_kafka_jars
from onceflow.resources.maven_jars import MavenMissingError
from onceflow.resources.processes import stop_process_group
from onceflow.resources.settings import SettingsError, load_settings
from onceflow.resources.spark_functions import ensure_spark_functions_jar


def cmd_setup(_: argparse.Namespace) -> int:
    # What takes a while (downloads, the class archive) says so as it goes, on stderr.
    logging.basicConfig(level=logging.INFO, format="onceflow setup: %(message)s")
    for jar in ensure_delta_jars():
        print(f"delta jar: {jar}")
    print(f"GCS connector (gs:// homes): {ensure_gcs_connector_jar()}")
    for jar in ensure_spark_kafka_jars():
        print(f"Spark's Kafka connector: {jar}")
    # The tests' and the demo's Kafka broker, resolved now so that no test downloads mid-run; a host that only
    # runs pipelines needs no broker, so a missing Maven is a note here (the tests require it under CI).
    try:
        print(f"Kafka broker (tests, demo): {ensure_kafka_broker_libs()}")
    except MavenMissingError as missing:
        print(f"Kafka broker (tests, demo): not resolved: {missing}")
    print(f"onceflow's Spark functions: {ensure_spark_functions_jar()}")
    # Only speed depends on the archive: a JVM that cannot dump one leaves a note, and drivers start without it.
    try:
        print(f"Spark driver class archive: {ensure_class_archive()}")
    except ClassArchiveError as failed:
        print(f"Spark driver class archive: not made: {failed}")
    return 0


def dagster_home() -> Path:
    """`$DAGSTER_HOME`, default `<ONCEFLOW_HOME>/dagster`, with the project's `dagster.yaml` in it."""
    settings = load_settings()
    if settings.dagster_home is None and settings.home_path.startswith("gs://"):
        raise SettingsError("DAGSTER_HOME: set it to a local directory when ONCEFLOW_HOME is on gs:// (the Dagster "
                            "instance does not live in the lake)")
    home = Path(settings.dagster_home or Path(settings.home_path) / "dagster")
    write_instance(home)
    return home


def dev_workspace(given: str | None, dagster_home: Path) -> Path:
    """The workspace `onceflow dev` serves: `--workspace`, else `./workspace.yaml` (a checkout's, or what
    `onceflow init` wrote), else onceflow's bundled code location, written beside the instance."""
    if given is not None:
        return Path(given).resolve()
    here = Path("workspace.yaml")
    return here.resolve() if here.exists() else write_workspace(dagster_home / "workspace.yaml")


def create_sources(emulator_host: str) -> None:
    """A fresh emulator has no topics: create every Pub/Sub pipeline's topic and subscriptions on it."""
    from onceflow.jobs.sources.reader import open_source
    from onceflow.orchestration.deployments import LAKE, PUBSUB, resources_for
    from onceflow.orchestration.pipelines import load_pipelines

    os.environ["PUBSUB_EMULATOR_HOST"] = emulator_host
    settings = load_settings()
    resources = resources_for(settings)
    for pipeline in load_pipelines(settings):
        print(open_source(pipeline, resources[LAKE], resources[PUBSUB].client).reader.ensure())


def cmd_dev(args: argparse.Namespace) -> int:
    from onceflow.resources.emulators.pubsub import start_pubsub_emulator

    home = dagster_home()
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    workspace = dev_workspace(args.workspace, home)
    # A SIGTERM (from make, a supervisor) must still stop dagster dev, the engine and the emulator, not orphan them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.ExitStack() as stack:
        if "PUBSUB_EMULATOR_HOST" not in env and not args.no_emulator:
            emulator = start_pubsub_emulator()
            stack.callback(emulator.stop)
            env["PUBSUB_EMULATOR_HOST"] = emulator.host
            print(f"Pub/Sub emulator on {emulator.host}")
            create_sources(emulator.host)
        if "ONCEFLOW_SPARK_REMOTE" not in env and not args.no_engine:
            engine = stack.enter_context(running_engine(args.master, args.cluster))
            env["ONCEFLOW_SPARK_REMOTE"] = engine.url
            print(f"Spark engine on {engine.url}")
        dev = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-w", str(workspace), "-h", args.host, "-p", str(args.port)],
            env=env,
            cwd=workspace.parent,
            start_new_session=True,
        )
        # dagster dev shuts its webserver, daemon and code servers down on SIGINT (Ctrl-C), not on SIGTERM.
        stack.callback(stop_process_group, dev, (signal.SIGINT, signal.SIGKILL), 30)
        try:
            return dev.wait()
        except KeyboardInterrupt:
            return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from onceflow.orchestration.cli.demo import run_demo

    return run_demo(args.profile, args.source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="fetch and cache the Delta jars and the GCS connector").set_defaults(func=cmd_setup)
    demo = sub.add_parser("demo", help="the end-to-end exactly-once demo")
    demo.add_argument("--profile", choices=("local", "cluster-gcs"), default="local",
                      help="cluster-gcs: a two-worker standalone cluster, the lake on the GCS emulator, Dagster on "
                           "PostgreSQL, all started for it")
    demo.add_argument("--source", choices=("pubsub", "kafka"), default="pubsub",
                      help="where the events come from: the Pub/Sub emulator, or a Kafka broker started for it")
    demo.set_defaults(func=cmd_demo)
    dev = sub.add_parser("dev", help="Dagster UI and daemon with the persistent instance")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=3000)
    dev.add_argument("--no-emulator", action="store_true", help="do not start a Pub/Sub emulator")
    dev.add_argument("--no-engine", action="store_true", help="no warm Spark engine: each run starts its own Spark")
    dev.add_argument("--workspace", help="the workspace.yaml to serve (default: ./workspace.yaml, else onceflow's "
                     "bundled code location)")
    add_engine_options(dev)
    dev.set_defaults(func=cmd_dev)
    add_init_command(sub)
    add_engine_commands(sub)
    add_commit_commands(sub)
    add_reset_commands(sub)
    add_status_commands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
