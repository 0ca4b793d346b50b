"""The resources every job, asset and sensor gets: those a project gives `onceflow.definitions(resources=...)`,
and for the keys it leaves out, resources built from the validated settings, per named deployment.

onceflow's resources take keys of their own (`onceflow_spark`, `onceflow_lake`, `onceflow_pubsub`,
`onceflow_bigquery`), so that they never collide with a project's (`bigquery` is the key every dagster-gcp user
has already). As in Dagster's own reference projects, the deployment (`ONCEFLOW_DEPLOYMENT`: `local`, the
default, or `prod`) chooses the defaults: `local` talks to the emulators when their hosts are set; `prod` talks to
Google Cloud only, names its projects explicitly and takes its one secret, a service-account key for BigQuery on
hosts without Application Default Credentials, through `dg.EnvVar`, so the key is read when a run starts and
never appears in a run's config or the UI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

from onceflow.resources.bigquery import BigQueryResource
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource
from onceflow.resources.settings import Settings, SettingsError
from onceflow.resources.spark import SparkResource

GCP_CREDENTIALS_VARIABLE = "ONCEFLOW_GCP_CREDENTIALS"
SPARK, LAKE, PUBSUB, BIGQUERY = "onceflow_spark", "onceflow_lake", "onceflow_pubsub", "onceflow_bigquery"
RESOURCE_TYPES: dict[str, type] = {SPARK: SparkResource, LAKE: LakeResource, PUBSUB: PubSubResource,
                                   BIGQUERY: BigQueryResource}


def resources_for(settings: Settings, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """onceflow's four resources: each of `given`'s as it is, the others the deployment's defaults. A key that is
    not onceflow's, or a resource of the wrong kind, raises `SettingsError` naming it."""
    given = dict(given or {})
    for key, resource in given.items():
        kind = RESOURCE_TYPES.get(key)
        if kind is None:
            raise SettingsError(f"resources: {key!r} is not a key of onceflow's resources ({', '.join(RESOURCE_TYPES)}); "
                                "a project's own resources go in its own Definitions (dg.Definitions.merge)")
        if not isinstance(resource, kind):
            raise SettingsError(f"resources: {key!r} is a {type(resource).__name__}, not a {kind.__name__}")
    builders = DEPLOYMENTS[settings.deployment]
    return {key: given[key] if key in given else builders[key](settings) for key in RESOURCE_TYPES}


def _spark(settings: Settings) -> SparkResource:
    return SparkResource(master=settings.spark_master, remote=settings.spark_remote, ui_enabled=settings.spark_ui,
                         conf=settings.spark_conf, jars=list(settings.spark_jars))


def _lake(settings: Settings) -> LakeResource:
    return LakeResource(home=settings.home_path, id_filters=settings.dedup_fast_path)


def _prod_only(variable: str, host: str | None) -> None:
    if host:
        raise SettingsError(f"ONCEFLOW_DEPLOYMENT=prod talks to Google Cloud only: unset {variable}")


def _prod_pubsub(settings: Settings) -> PubSubResource:
    _prod_only("PUBSUB_EMULATOR_HOST", settings.pubsub_emulator_host)
    if "pubsub_project" not in settings.model_fields_set:
        raise SettingsError("ONCEFLOW_DEPLOYMENT=prod needs ONCEFLOW_PUBSUB_PROJECT (the GCP project of the topics)")
    return PubSubResource(project=settings.pubsub_project, emulator_host=None)


def _prod_bigquery(settings: Settings) -> BigQueryResource:
    _prod_only("BIGQUERY_EMULATOR_HOST", settings.bigquery_emulator_host)
    credentials = dg.EnvVar(GCP_CREDENTIALS_VARIABLE) if settings.gcp_credentials is not None else None
    return BigQueryResource(project=settings.bigquery_project, gcp_credentials=credentials)


DEPLOYMENTS: dict[str, dict[str, Callable[[Settings], Any]]] = {
    "local": {
        SPARK: _spark, LAKE: _lake,
        PUBSUB: lambda s: PubSubResource(project=s.pubsub_project, emulator_host=s.pubsub_emulator_host),
        BIGQUERY: lambda s: BigQueryResource(project=s.bigquery_project, api_endpoint=s.bigquery_emulator_host),
    },
    "prod": {SPARK: _spark, LAKE: _lake, PUBSUB: _prod_pubsub, BIGQUERY: _prod_bigquery},
}
