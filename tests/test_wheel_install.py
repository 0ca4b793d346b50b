"""The installed package next to a user's Dagster project: one import name, nothing shadowed.

The wheel is built from this checkout and installed into a fresh virtualenv (its dependencies come from the
project's own virtualenv through a `.pth` line, so nothing is downloaded and the checkout's editable install is
not on the path). A toy Dagster project with its own `assets` and `resources` packages then loads its definitions
and onceflow's side by side, with `from onceflow import …` and `onceflow.definitions([...])`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from deltalake import DeltaTable

import onceflow
from onceflow.resources.spark_connect import SparkConnectServer

REPO = Path(__file__).resolve().parents[1]
PACKAGED = ("pyproject.toml", "README.md", "LICENSE", "onceflow", "orchestration", "assets", "jobs", "resources")

TOY_DEFINITIONS = '''
import dagster as dg
from pyspark.sql import functions as F

import onceflow
from assets import toy_asset
from onceflow import FileSink, FileSource, Pipeline, WindowedOutput
from onceflow.resources.lake import LakeResource
from onceflow.resources.spark import SparkResource
from resources import ToyResource


def region_sales(records):
    return records.groupBy("region").agg(F.count("*").alias("orders"))


orders = Pipeline(
    name="toy_orders",
    source=FileSource(directory="orders", timestamp_field="ts", id_field="order_id"),
    schema="region STRING NOT NULL, amount DECIMAL(18,2)",
    outputs=[WindowedOutput(asset="toy_sales", window="5m", keys=["region"], transform=region_sales,
                            sinks=[FileSink()])],
)
# Settings from Dagster resources, configured in code: not one ONCEFLOW_* variable.
onceflow_resources = {"onceflow_lake": LakeResource(home=dg.EnvVar("TOY_LAKE")),
                      "onceflow_spark": SparkResource(remote=dg.EnvVar("TOY_SPARK"))}
defs = dg.Definitions.merge(
    onceflow.definitions([orders], resources=onceflow_resources),
    dg.Definitions(assets=[toy_asset], resources={"toy": ToyResource()}),
)
'''

PROBE = '''
import json, sys
import dagster as dg
sys.path.insert(0, ".")
import assets, onceflow, resources, toy_definitions
defs = toy_definitions.defs
repo = defs.get_repository_def()
print(json.dumps({
    "onceflow": onceflow.__file__, "assets": assets.__file__, "resources": resources.__file__,
    "jobs": sorted(j.name for j in repo.get_all_jobs()),
    "assets_keys": sorted(k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()),
    "sensors": sorted(s.name for s in repo.sensor_defs),
}))
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in PACKAGED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)],
                   check=True, capture_output=True, timeout=600)
    return next(out.glob("onceflow-*.whl"))


def test_the_wheel_holds_one_import_name_and_the_java_of_its_stages(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"onceflow", f"onceflow-{onceflow.__version__}.dist-info"}
    # Every Java source of the checkout: the jar of onceflow's Spark functions is compiled from them where it runs.
    java = {f"onceflow/{path.relative_to(REPO).as_posix()}" for path in
            [*REPO.glob("jobs/*/*.java"), *REPO.glob("resources/*.java")]}
    assert {"onceflow/jobs/ingest/LocalProjection.java", "onceflow/resources/Py4JNoDelay.java"} <= java
    assert {*java, "onceflow/orchestration/definitions.py"} <= set(names)
    entry_points = zipfile.ZipFile(wheel).read(f"onceflow-{onceflow.__version__}.dist-info/entry_points.txt").decode()
    assert "onceflow = onceflow.orchestration.cli.main:main" in entry_points
    # Apache-2.0 by its SPDX expression, the license text beside it, and the types of the public API.
    metadata = zipfile.ZipFile(wheel).read(f"onceflow-{onceflow.__version__}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata and "Classifier: Typing :: Typed" in metadata
    assert {f"onceflow-{onceflow.__version__}.dist-info/licenses/LICENSE", "onceflow/py.typed"} <= set(names)


def test_a_dagster_project_with_its_own_assets_and_resources_loads_beside_onceflow(
    wheel: Path, tmp_path: Path, spark_connect: SparkConnectServer
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # Dependencies from the project's virtualenv: a plain path, so its editable onceflow finder is not loaded.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    project = tmp_path / "toy_project"
    (project / "assets").mkdir(parents=True)
    (project / "resources").mkdir()
    (project / "orders").mkdir()
    (project / "assets" / "__init__.py").write_text(textwrap.dedent('''
        import dagster as dg

        @dg.asset
        def toy_asset() -> int:
            return 1
    '''))
    (project / "resources" / "__init__.py").write_text(textwrap.dedent('''
        import dagster as dg

        class ToyResource(dg.ConfigurableResource):
            name: str = "toy"
    '''))
    (project / "toy_definitions.py").write_text(TOY_DEFINITIONS)
    lake = tmp_path / "lake-home"
    # HOME as it is: `onceflow setup` finds the jars this machine's set-up cached.
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "TOY_LAKE": str(lake), "TOY_SPARK": spark_connect.url,
           "HOME": os.environ["HOME"], "DAGSTER_HOME": str(project / ".dagster")}

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        return done

    loaded = json.loads(run(str(python), "-c", PROBE).stdout.strip().splitlines()[-1])

    assert Path(loaded["onceflow"]).is_relative_to(site)
    assert Path(loaded["assets"]).is_relative_to(project) and Path(loaded["resources"]).is_relative_to(project)
    assert {"ingest_toy_orders", "finalize_commits"} <= set(loaded["jobs"])
    assert {"toy_asset", "toy_sales", "raw_toy_orders"} <= set(loaded["assets_keys"])
    assert {"toy_orders_micro_batch_sensor", "toy_sales_window_sensor"} <= set(loaded["sensors"])

    # From the wheel alone: the project's Dagster set-up, onceflow's, a validated code location, one micro-batch.
    assert "wrote" in run(str(venv / "bin" / "onceflow"), "init", "--module", "toy_definitions").stdout
    assert "RunLauncher" in (project / ".dagster" / "dagster.yaml").read_text()
    run(str(venv / "bin" / "onceflow"), "setup")
    run(str(python), "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml")
    now = int(time.time() * 1000)
    orders = [{"order_id": f"o{n}", "ts": now - 60_000 + n, "region": "eu", "amount": "2.50"} for n in range(3)]
    (project / "orders" / "a.jsonl").write_text("".join(json.dumps(o) + "\n" for o in [*orders, orders[0]]))
    run(str(python), "-m", "dagster", "job", "execute", "-m", "toy_definitions", "-j", "ingest_toy_orders")
    raw = DeltaTable(str(lake / "lake" / "raw" / "toy_orders")).to_pyarrow_table(columns=["record_id", "amount"])
    assert sorted(raw.column("record_id").to_pylist()) == ["o0", "o1", "o2"]
    assert not [name for name in env if name.startswith("ONCEFLOW_")]
