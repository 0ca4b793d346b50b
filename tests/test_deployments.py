"""Named deployments choose the resources (`ONCEFLOW_DEPLOYMENT=local|prod`): the whole code location loads for
both; `prod` talks to Google Cloud only and takes its secret through `dg.EnvVar`, never as a value."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import dagster as dg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from onceflow.orchestration.definitions import definitions
from onceflow.orchestration.deployments import BIGQUERY, GCP_CREDENTIALS_VARIABLE, LAKE, PUBSUB, SPARK
from onceflow.resources.bigquery import BigQueryResource
from onceflow.resources.lake import LakeResource
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
    assert defs.resources[PUBSUB].emulator_host == "127.0.0.1:8085"
    assert defs.resources[BIGQUERY].api_endpoint == "http://127.0.0.1:9050"
    assert defs.resources[BIGQUERY].gcp_credentials is None
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
    pubsub, bigquery = defs.resources[PUBSUB], defs.resources[BIGQUERY]
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


def test_prod_bigquery_client_is_dagster_gcps_made_with_the_resources_key(monkeypatch: pytest.MonkeyPatch) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    account = {"type": "service_account", "project_id": "acme-keys", "private_key_id": "1", "private_key": key,
               "client_email": "onceflow@acme-keys.iam.gserviceaccount.com", "client_id": "1",
               "token_uri": "https://oauth2.googleapis.com/token"}
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    encoded = base64.b64encode(json.dumps(account).encode()).decode()
    resource = BigQueryResource(project="acme-warehouse", location="EU", gcp_credentials=encoded)
    with resource.get_client() as client:  # made without a network call
        assert (client.project, client.location) == ("acme-warehouse", "EU")
        assert client._credentials.service_account_email == account["client_email"]


def test_a_project_configures_onceflows_resources_in_code_under_keys_of_their_own(
    spark_connect: SparkConnectServer, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ONCEFLOW_HOME")
    monkeypatch.setenv("LAKE_HOME", str(tmp_path / "lake-home"))
    lake = LakeResource(home=dg.EnvVar("LAKE_HOME"))
    defs = definitions(resources={LAKE: lake})
    dg.Definitions.validate_loadable(defs)
    assert defs.resources[LAKE] is lake and set(defs.resources) == {LAKE, SPARK, PUBSUB, BIGQUERY}
    # The load read the variable (the raw asset's table is under it); runs read it again when they start.
    raw = next(spec for spec in defs.assets if isinstance(spec, dg.AssetSpec) and spec.key.path == ["raw_events"])
    assert raw.metadata["dagster/uri"] == str(tmp_path / "lake-home" / "lake" / "raw" / "events")
    # A key that is not onceflow's (a dagster-gcp user's `bigquery`, say) or a resource of the wrong kind is named.
    with pytest.raises(SettingsError, match=r"resources: 'bigquery' is not a key of onceflow's resources"):
        definitions(resources={"bigquery": BigQueryResource()})
    with pytest.raises(SettingsError, match=r"resources: 'onceflow_lake' is a BigQueryResource, not a LakeResource"):
        definitions(resources={LAKE: BigQueryResource()})
