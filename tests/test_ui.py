"""The Dagster UI in a real browser: `dagster dev` on loopback, headless Chromium, screenshots, asserted page text."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from playwright.sync_api import expect

from onceflow.jobs.windows.panes import Window
from onceflow.orchestration.checkout import PROJECT_ROOT
from onceflow.orchestration.cli.main import create_sources
from onceflow.orchestration.instance import write_instance
from onceflow.resources.emulators.pubsub import PubSubEmulator, free_port
from onceflow.resources.processes import stop_process_group
from onceflow.resources.spark_connect import SparkConnectServer
from tests.browser import chromium_page, chromium_path, screenshot_after, shows, visit
from tests.conftest import require
from tests.test_windows import minute_base

LOCATION = "onceflow.orchestration.definitions"
DEV = ["dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1"]
MATERIALIZE = ["dagster", "asset", "materialize", "-m", LOCATION, "--select", "event_counts"]
# pyspark marks a process that opened a Spark Connect session; that is this process's state, not a setting.
INHERITED = ("ONCEFLOW_CRASH_AT", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
SENSORS = [
    "events_micro_batch_sensor", "event_counts_window_sensor", "orders_micro_batch_sensor", "region_sales_window_sensor",
    "commit_sensor", "dead_run_sensor",
]
# Dagster's UI opens a newsletter dialog on localhost until it is dismissed, which this browser has done already.
NUX_DISMISSED = 'window.localStorage.setItem("communityNux", JSON.stringify("1"))'
# The placeholder Dagster's UI draws where data is still loading.
LOADING = "[class*='Skeleton_skeleton']"
SCREENSHOTS = PROJECT_ROOT / ".onceflow" / "screenshots"
RUN_SUCCESS = re.compile(r"([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}) - .*RUN_SUCCESS")
LOCATION_QUERY = """{ workspaceOrError { ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def child_env(home: Path, dagster_home: Path, spark: SparkConnectServer, pubsub: PubSubEmulator) -> dict[str, str]:
    env = {**os.environ, "ONCEFLOW_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
    for inherited in INHERITED:
        env.pop(inherited, None)
    env["ONCEFLOW_SPARK_REMOTE"] = spark.url
    # The sensors run in `dagster dev`: `events` reads an empty directory, `orders` an emulator topic of its own.
    env["ONCEFLOW_EVENTS_SOURCE"] = "files"
    env["ONCEFLOW_EVENTS_DIR"] = str(home / "incoming" / "events")
    env["PUBSUB_EMULATOR_HOST"] = pubsub.host
    env["ONCEFLOW_PUBSUB_PROJECT"] = f"ui-{uuid.uuid4().hex[:8]}"
    return env


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def location_loaded(url: str) -> bool:
    """Whether the webserver answers and has loaded the code location; a load error fails at once."""
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2):
            pass
        request = urllib.request.Request(
            f"{url}/graphql",
            data=json.dumps({"query": LOCATION_QUERY}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            entries = json.load(response)["data"]["workspaceOrError"]["locationEntries"]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
    entry = next((e for e in entries if e["name"] == LOCATION), None)
    if entry is None or entry["loadStatus"] != "LOADED":
        return False
    error = entry["locationOrLoadError"]
    assert error["__typename"] != "PythonError", f"{LOCATION} failed to load: {error.get('message')}"
    return True


@contextmanager
def dagster_dev(env: dict[str, str], log_path: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """`dagster dev` on a free loopback port, yielding its URL once the code location has loaded."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *DEV, "-p", str(port)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not location_loaded(url):
            assert process.poll() is None, f"dagster dev exited with {process.returncode}:\n{tail(log_path)}"
            assert time.monotonic() < deadline, f"dagster dev not up in {timeout_s:.0f} s:\n{tail(log_path)}"
            time.sleep(0.25)
        yield url
    finally:
        # dagster dev shuts its webserver, daemon and code servers down on SIGINT (Ctrl-C), not on SIGTERM.
        stop_process_group(process, (signal.SIGINT, signal.SIGKILL), timeout_s=30)


@pytest.mark.slow
def test_ui_shows_materialized_partitions_and_sensors(
    spark_connect: SparkConnectServer, pubsub_emulator: PubSubEmulator, home: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require(chromium_path() is not None, "Chromium (apt-get install chromium)")
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    write_instance(dagster_home)
    # Create the instance's SQLite storages now: dagster dev and the materialization below start together, and
    # two processes creating the same tables race ("table ... already exists").
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        assert all((instance.run_storage, instance.event_log_storage, instance.schedule_storage))
    env = child_env(home, dagster_home, spark_connect, pubsub_emulator)
    for name in ("ONCEFLOW_EVENTS_SOURCE", "ONCEFLOW_EVENTS_DIR", "ONCEFLOW_PUBSUB_PROJECT"):
        monkeypatch.setenv(name, env[name])
    create_sources(pubsub_emulator.host)  # the directory of `events`, the topic and subscriptions of `orders`

    # Two windows from two hours ago: inside the partitions, empty (no events) but materialized all the same.
    base = minute_base()
    first, second = (Window(base + i * 60_000, base + (i + 1) * 60_000).key for i in range(2))
    # Materialize while dagster dev starts (into the same instance): the test waits for the slower one only.
    materialize = subprocess.Popen(
        [sys.executable, "-m", *MATERIALIZE, "--partition-range", f"{first}...{second}"],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        with dagster_dev(env, tmp_path / "dagster-dev.log") as url, chromium_page([NUX_DISMISSED]) as page:
            output, _ = materialize.communicate(timeout=180)
            assert materialize.returncode == 0, output[-3000:]
            run_ids = RUN_SUCCESS.findall(output)
            # The single-run backfill policy: one run materializes both partitions.
            assert len(run_ids) == 1, output[-3000:]

            # (a) The asset's partitions, only the materialized ones listed, the newer one opened.
            with screenshot_after(page, tmp_path / "event_counts_partitions.png", SCREENSHOTS):
                query = f"view=partitions&status=MATERIALIZED&partition={second}"
                visit(page, f"{url}/assets/event_counts?{query}")
                shows(page, "event_counts")
                shows(page, "Materialized (2)")
                shows(page, "2 Partitions Selected")
                for key in (first, second):
                    shows(page, key)
                shows(page, "Materialized")  # the opened partition's status tag
                shows(page, run_ids[0][:8])  # its latest materialization links to our run

            # (b) The automation page lists the code location's sensors, each linking to its own page.
            with screenshot_after(page, tmp_path / "automation.png", SCREENSHOTS):
                visit(page, f"{url}/automation")
                shows(page, LOCATION)
                sensor_links = page.locator(f"a[href^='/locations/{LOCATION}/sensors/']")
                expect(sensor_links.first).to_be_visible()
                for name in SENSORS:
                    try:
                        shows(page.locator(f"a[href='/locations/{LOCATION}/sensors/{name}']"), name)
                    except AssertionError:
                        shown = [str(a.get_attribute("href")).rsplit("/", 1)[-1] for a in sensor_links.all()]
                        raise AssertionError(f"the automation page lists {shown}, not {name}") from None
                # Each row loads its sensor's type and status on its own: let them land before the screenshot.
                expect(page.locator(LOADING)).to_have_count(0)
    finally:
        stop_process_group(materialize)
