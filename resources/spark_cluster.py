"""A Spark standalone cluster on this machine: one master and N workers from the pyspark wheel's own `spark-class`.

pip's pyspark ships no `sbin/start-*.sh`, so each daemon runs `bin/spark-class` with the Master or Worker class,
in its own process group (a worker's executors are its children), bound to 127.0.0.1. Every port is chosen by
the daemon itself (port 0) and read back from its log, so clusters started side by side never collide; the
master's REST submission server (a fixed port, unused by onceflow) is off. Tests, `onceflow engine --cluster` and
`local_stack(spark="cluster")` start one to prove onceflow on a real cluster; a production cluster is Dataproc or
Spark on Kubernetes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from onceflow.resources.processes import stop_process_group

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


class SparkClusterError(RuntimeError):
    """A daemon of the standalone cluster exited or did not come up in time; the message holds its log's tail."""


@dataclass
class SparkCluster:
    master_url: str
    """What `ONCEFLOW_SPARK_MASTER` (or `onceflow engine --master`) must be set to: `spark://127.0.0.1:P`."""
    web_url: str
    """The master's web UI; `<web_url>/json/` is its state (workers, applications)."""
    workdir: Path
    """Logs (`master.log`, `worker-N.log`) and each worker's work directory (`worker-N/<app id>/<executor>/`)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def status(self) -> dict:
        """The master's JSON state: `workers`, `aliveworkers`, `activeapps`, `completedapps`, ..."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=10) as response:
            return json.load(response)

    def worker_dirs(self) -> list[Path]:
        return sorted(self.workdir.glob("worker-*/"))

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master; idempotent."""
        for process in reversed(self.processes):
            stop_process_group(process)
        shutil.rmtree(self.workdir, ignore_errors=True)


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark wheel."""
    return Path(pyspark.__file__).parent


def spark_env(local_ip: str | None = None) -> dict[str, str]:
    """The environment of a Spark process onceflow starts: the wheel's Spark, this interpreter for Python workers,
    and `SPARK_LOCAL_IP` as `local_ip` when the caller's environment sets none."""
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "PYSPARK_PYTHON": sys.executable}
    if local_ip is not None:
        env.setdefault("SPARK_LOCAL_IP", local_ip)
    return env


def start_spark_cluster(
    workers: int = 2, cores: int = 1, memory: str = "1g", timeout_s: float = 240.0
) -> SparkCluster:
    """Start a master and `workers` workers of `cores` cores and `memory` each on 127.0.0.1; return once every
    worker has registered with the master."""
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-spark-cluster-"))
    properties = workdir / "spark-defaults.conf"
    properties.write_text("spark.master.rest.enabled false\n")
    cluster = SparkCluster("", "", workdir)
    deadline = time.monotonic() + timeout_s
    try:
        master_log = workdir / "master.log"
        cluster.processes.append(_daemon(
            [MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--properties-file",
             str(properties)], master_log,
        ))
        url, ui_port = _await_master(cluster.processes[0], master_log, deadline)
        cluster.master_url, cluster.web_url = url, f"http://127.0.0.1:{ui_port}"
        for n in range(workers):
            work = workdir / f"worker-{n}"
            work.mkdir()
            cluster.processes.append(_daemon(
                [WORKER_CLASS, url, "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                 "--webui-port", "0", "--work-dir", str(work), "--properties-file", str(properties)],
                workdir / f"worker-{n}.log",
            ))
        _await_workers(cluster, workers, deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _daemon(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args], stdout=log, stderr=subprocess.STDOUT,
            env=spark_env(local_ip="127.0.0.1"), start_new_session=True,
        )


def _await_master(process: subprocess.Popen[bytes], log_path: Path, deadline: float) -> tuple[str, str]:
    while time.monotonic() < deadline:
        log = log_path.read_text(errors="replace")
        url, ui = _MASTER_URL.search(log), _MASTER_UI.search(log)
        if url and ui:
            return url.group(1), ui.group(1)
        if process.poll() is not None:
            raise SparkClusterError(f"the Spark master exited: {log[-3000:]}")
        time.sleep(0.5)
    raise SparkClusterError(f"the Spark master did not start in time: {log_path.read_text(errors='replace')[-3000:]}")


def _await_workers(cluster: SparkCluster, workers: int, deadline: float) -> None:
    unanswered: urllib.error.URLError | None = None
    while time.monotonic() < deadline:
        for n, process in enumerate(cluster.processes):
            if process.poll() is not None:
                name = "master" if n == 0 else f"worker-{n - 1}"
                log = (cluster.workdir / f"{name}.log").read_text(errors="replace")
                raise SparkClusterError(f"the Spark {name} exited: {log[-3000:]}")
        try:
            if cluster.status()["aliveworkers"] >= workers:
                return
        except urllib.error.URLError as error:
            # Its UI's port is in the log as soon as it is bound, before every page answers (a 404 was seen).
            unanswered = error
        time.sleep(0.5)
    raise SparkClusterError(f"{workers} Spark workers did not register with {cluster.master_url} in time"
                            + (f" (its UI last answered {unanswered})" if unanswered else ""))
