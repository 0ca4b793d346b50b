"""A Spark Connect server with Delta configured: the warm engine that short-lived processes connect to.

A new local Spark session pays for JVM start-up and warm-up, which dominates a short run; a Spark Connect client
only opens a connection, and finds the server's JIT already warm. The server runs `spark-submit` from the
pyspark wheel in its own process group on a loopback port and is stopped by signalling that group. It is the
driver of its own master: `local[2]` by default, or a cluster (`spark://...`), whose executors get the engine's
jars through `--jars`.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from onceflow.resources.emulators.pubsub import PORT_TRIES, free_port
from onceflow.resources.processes import listens, stop_process_group
from onceflow.resources.settings import Settings
from onceflow.resources.spark import engine_conf, engine_jars
from onceflow.resources.spark_cluster import spark_env, spark_home
from onceflow.resources.spark_functions import SERVER_FUNCTIONS, SERVER_PLUGIN


@dataclass
class SparkConnectServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        """What `ONCEFLOW_SPARK_REMOTE` must be set to."""
        return f"sc://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process_group(self.process)


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it after it was chosen."""


def start_spark_connect_server(
    master: str = "local[2]",
    port: int | None = None,
    driver_memory: str = "2g",
    timeout_s: float = 120.0,
    conf: Mapping[str, str] | None = None,
    jars: Sequence[str] = (),
) -> SparkConnectServer:
    """Start a Delta-enabled Spark Connect server on 127.0.0.1 driving `master` (with the user's extra `conf` and
    `jars`, see `onceflow.resources.spark`) and wait until it accepts connections: on `port`, else on a free port
    (another one if a process takes the first before the server binds it)."""
    conf = {
        "spark.ui.enabled": "false",
        **engine_conf(master, conf),
        "spark.connect.grpc.binding.address": "127.0.0.1",
    }
    # Its sessions get onceflow's compiled functions, which a client cannot register, and its planner the plugin
    # that evaluates a client's projection of a few rows on the driver.
    for key, value in (("spark.sql.extensions", SERVER_FUNCTIONS),
                       ("spark.connect.extensions.relation.classes", SERVER_PLUGIN)):
        conf[key] = ",".join(filter(None, (conf.get(key), value)))
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name", "onceflow-spark-connect",
        "--master", master,
        "--driver-memory", driver_memory,
        "--jars", ",".join(engine_jars(jars)),
    ]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    # The whole engine on this machine: its driver binds to loopback too. A remote cluster's executors must reach
    # the driver, so there the machine's address (or the user's SPARK_LOCAL_IP) stays.
    env = spark_env(local_ip="127.0.0.1" if on_this_machine(master) else None)
    for _ in range(0 if port else PORT_TRIES - 1):
        try:
            return _start(command, env, free_port(), timeout_s)
        except PortTaken:
            continue
    return _start(command, env, port or free_port(), timeout_s)


def _start(command: list[str], env: dict[str, str], port: int, timeout_s: float) -> SparkConnectServer:
    """Run `command` binding `port`; the server once it listens there itself."""
    log_path = Path(tempfile.mkdtemp(prefix="onceflow-spark-connect-")) / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([*command, "--conf", f"spark.connect.grpc.binding.port={port}"], stdout=log,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = SparkConnectServer(process, port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log_path.read_text(errors="replace")
            if "java.net.BindException" in text:
                raise PortTaken(f"Spark Connect server: port {port} was taken before it could bind it")
            raise RuntimeError(f"Spark Connect server exited: {text[-3000:]}")
        if listens(process, port):
            return server
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"Spark Connect server did not listen on port {port} within {timeout_s:.0f}s")


def on_this_machine(master: str) -> bool:
    """Whether a Spark `master` runs its executors on this machine (local, or a cluster on loopback)."""
    return master.startswith("local") or "//127.0.0.1:" in master


def start_engine(settings: Settings, master: str | None = None, port: int | None = None) -> SparkConnectServer:
    """The warm engine of `onceflow engine`, `onceflow dev` and the local stack: a Spark Connect server on `master`
    (default `ONCEFLOW_SPARK_MASTER`) with the settings' Spark conf and extra jars."""
    return start_spark_connect_server(
        master or settings.spark_master, port, conf=settings.spark_conf, jars=settings.spark_jars
    )
