"""A Spark Connect server with Delta configured: the warm engine that short-lived processes connect to.

A new local Spark session costs 8-14 s of JVM start-up and warm-up on a small machine; a Spark Connect client
connects in about a second and finds the server's JIT already warm. The server runs `spark-submit` from the
pyspark wheel in its own process group on a loopback port and is stopped by signalling that group.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

from resources.gcs import spark_gcs_conf
from resources.processes import stop_process_group
from resources.pubsub_emulator import free_port
from resources.spark import DELTA_CONF, PARQUET_CONF, SMALL_MACHINE_CONF, engine_jars


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


def start_spark_connect_server(
    master: str = "local[2]", port: int | None = None, driver_memory: str = "2g", timeout_s: float = 120.0
) -> SparkConnectServer:
    """Start a Delta-enabled Spark Connect server on 127.0.0.1 and wait until it accepts connections."""
    port = port or free_port()
    spark_home = Path(pyspark.__file__).parent
    conf = {
        **SMALL_MACHINE_CONF,
        **PARQUET_CONF,
        **DELTA_CONF,
        **spark_gcs_conf(),
        "spark.ui.enabled": "false",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
    }
    command = [
        str(spark_home / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name", "onceflow-spark-connect",
        "--master", master,
        "--driver-memory", driver_memory,
        "--jars", ",".join(map(str, engine_jars())),
    ]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    log_path = Path(tempfile.mkdtemp(prefix="onceflow-spark-connect-")) / "server.log"
    env = {**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = SparkConnectServer(process, port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Spark Connect server exited: {log_path.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"Spark Connect server did not listen on port {port} within {timeout_s:.0f}s")
