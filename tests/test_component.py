"""onceflow as a `dg` component: a user's Dagster project adds its pipelines with a `defs.yaml`, loaded by Dagster's
own loader (`dg.load_from_defs_folder`, what a `dg` project's definitions module calls)."""

from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster.components.core.package_entry import discover_entry_point_package_objects
from dagster_shared.serdes.objects import EnvRegistryKey

from onceflow.orchestration.component import OnceflowPipelines
from onceflow.orchestration.deployments import BIGQUERY, LAKE, PUBSUB, SPARK
from onceflow.resources.spark_connect import SparkConnectServer

PIPELINES_MODULE = "from tests.user_pipelines import clicks\n\nPIPELINES = [clicks]\n"


@pytest.fixture
def project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_connect: SparkConnectServer, home: Path, user_package: str
) -> Path:
    """A `dg` project, `my_project`, as `dg scaffold project` lays it out, with a pipelines module; its
    `defs/onceflow/defs.yaml` is each test's to write."""
    root = tmp_path / user_package
    package = root / "src" / user_package
    (package / "defs" / "onceflow").mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "my_project"
        version = "0.1.0"
        dependencies = ["onceflow"]

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "my_project"
        """))
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "onceflow_pipelines.py").write_text(PIPELINES_MODULE)
    monkeypatch.syspath_prepend(str(root / "src"))
    return root


def write_defs(project: Path, attributes: str) -> None:
    (project / "src" / "my_project" / "defs" / "onceflow" / "defs.yaml").write_text(
        "type: onceflow.OnceflowPipelines\nattributes:\n" + textwrap.indent(attributes, "  ")
    )


def test_a_defs_yaml_adds_the_pipelines_to_a_dg_project(project: Path) -> None:
    write_defs(project, "pipelines_module: my_project.onceflow_pipelines\n")

    defs = dg.load_from_defs_folder(path_within_project=project)

    job = defs.get_job_def("ingest_clicks")
    assert [node.name for node in job.nodes] == ["micro_batch_clicks"]
    assert job.tags["onceflow/source"] == "clicks/files"
    assert {s.name for s in defs.sensors or []} == {
        "clicks_micro_batch_sensor", "page_views_window_sensor", "daily_users_window_sensor",
        "commit_sensor", "dead_run_sensor",
    }
    views = defs.get_assets_def("page_views")
    assert isinstance(views.partitions_def, dg.TimeWindowPartitionsDefinition)
    assert views.partitions_def.cron_schedule == "0 * * * *"
    assert dg.AssetKey("raw_clicks") in views.dependency_keys
    # A window asset with its checks and freshness policy, as `onceflow.definitions` builds it.
    assert {c.name for c in views.check_specs} == {"counts_match_raw", "late_records_accounted", "no_duplicate_record_ids"}
    policy = views.specs_by_key[dg.AssetKey("page_views")].freshness_policy
    assert isinstance(policy, dg.FreshnessPolicy)
    assert policy.fail_window.to_timedelta() == timedelta(hours=1, seconds=10 + 120, minutes=5)
    assert defs.get_assets_def("daily_users").partitions_def.cron_schedule == "0 0 * * *"
    assert {SPARK, LAKE, PUBSUB, BIGQUERY} <= set(defs.resources or {})


def test_the_component_s_deployment_chooses_the_resources(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONCEFLOW_PUBSUB_PROJECT", raising=False)
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("BIGQUERY_EMULATOR_HOST", raising=False)
    write_defs(project, "pipelines_module: my_project.onceflow_pipelines\ndeployment: prod\n")

    with pytest.raises(Exception) as raised:  # Dagster wraps a component's error in its own
        dg.load_from_defs_folder(path_within_project=project)
    assert "ONCEFLOW_DEPLOYMENT=prod needs ONCEFLOW_PUBSUB_PROJECT" in _messages(raised.value)

    monkeypatch.setenv("ONCEFLOW_PUBSUB_PROJECT", "my-gcp-project")
    defs = dg.load_from_defs_folder(path_within_project=project)
    pubsub = (defs.resources or {})[PUBSUB]
    assert (pubsub.project, pubsub.emulator_host) == ("my-gcp-project", None)


def test_a_module_without_pipelines_fails_the_load_naming_the_attribute(project: Path) -> None:
    write_defs(project, "pipelines_module: my_project.defs\n")
    with pytest.raises(Exception) as raised:
        dg.load_from_defs_folder(path_within_project=project)
    assert "pipelines_module: 'my_project.defs': the module must define PIPELINES" in _messages(raised.value)


def test_the_distribution_registers_the_component_with_dg() -> None:
    """What `dg list components` lists: the installed distribution's `dagster_dg_cli.registry_modules` entry."""
    components = discover_entry_point_package_objects()
    assert components[EnvRegistryKey(namespace="onceflow", name="OnceflowPipelines")] is OnceflowPipelines


def _messages(error: BaseException) -> str:
    """The error and every error it was raised from."""
    texts = []
    current: BaseException | None = error
    while current is not None:
        texts.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(texts)
