"""Named deployments choose the resources (`ONCEFLOW_DEPLOYMENT=local|prod`): the whole code location loads for
both; `prod` talks to Google Cloud only and takes its secret through `dg.EnvVar`, never as a value."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from onceflow.orchestration.definitions import definitions
from onceflow.orchestration.deployments import GCP_CREDENTIALS_VARIABLE
from onceflow.resources.settings import SettingsError
from onceflow.resources.spark_connect import SparkConnectServer

SECRET = "c2VydmljZS1hY2NvdW50LWtleQ=="  # base64 of a (fake) service-account key


def load(monkeypatch: pytest.MonkeyPatch, deployment: str) -> dg.Definitions:
    monkeypatch.setenv("ONCEFLOW_DEPLOYMENT", deployment)
    defs = definitions()
    dg.Definitions.validate_loadable(defs)
    return defs


def test_local_loads_whole_with_the_emulators(
    spark_connect: SparkConnectServer, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")
    monkeypatch.setenv("BIGQUERY_EMULATOR_HOST", "http://127.0.0.1:9050")
    defs = load(monkeypatch, "local")
    assert defs.resources["pubsub"].emulator_host == "127.0.0.1:8085"
    assert defs.resources["bigquery"].api_endpoint == "http://127.0.0.1:9050"
    assert defs.resources["bigquery"].gcp_credentials is None
    assert defs.get_job_def("prune_runs") is not None
    assert defs.get_schedule_def("prune_runs_hourly").job_name == "prune_runs"


def test_prod_loads_whole_on_google_cloud_with_its_secret_from_the_environment(
    spark_connect: SparkConnectServer, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for emulator in ("PUBSUB_EMULATOR_HOST", "BIGQUERY_EMULATOR_HOST"):
        monkeypatch.delenv(emulator, raising=False)
    monkeypatch.setenv("ONCEFLOW_PUBSUB_PROJECT", "acme-data")
    monkeypatch.setenv("ONCEFLOW_BIGQUERY_PROJECT", "acme-warehouse")
    monkeypatch.setenv(GCP_CREDENTIALS_VARIABLE, SECRET)
    defs = load(monkeypatch, "prod")
    pubsub, bigquery = defs.resources["pubsub"], defs.resources["bigquery"]
    assert (pubsub.project, pubsub.emulator_host) == ("acme-data", None)
    assert (bigquery.project, bigquery.api_endpoint) == ("acme-warehouse", None)
    credentials = bigquery.gcp_credentials
    assert isinstance(credentials, dg.EnvVar) and credentials.env_var_name == GCP_CREDENTIALS_VARIABLE
    assert credentials.get_value() == SECRET  # read when a run starts, not stored in the definitions
    assert SECRET not in repr(defs.resources)
    assert {job.name for job in defs.resolve_all_job_defs()} >= {"ingest_events", "ingest_orders", "prune_runs"}


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"ONCEFLOW_PUBSUB_PROJECT": "acme", "PUBSUB_EMULATOR_HOST": "127.0.0.1:8085"},
         "ONCEFLOW_DEPLOYMENT=prod talks to Google Cloud only: unset PUBSUB_EMULATOR_HOST"),
        ({}, "ONCEFLOW_DEPLOYMENT=prod needs ONCEFLOW_PUBSUB_PROJECT"),
    ],
)
def test_prod_refuses_emulators_and_an_unnamed_project(
    home: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    for emulator in ("PUBSUB_EMULATOR_HOST", "BIGQUERY_EMULATOR_HOST", "ONCEFLOW_PUBSUB_PROJECT"):
        monkeypatch.delenv(emulator, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ONCEFLOW_DEPLOYMENT", "prod")
    with pytest.raises(SettingsError, match=message):
        definitions()


def test_an_unknown_deployment_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_DEPLOYMENT", "staging")
    with pytest.raises(SettingsError, match="ONCEFLOW_DEPLOYMENT='staging'"):
        definitions()
