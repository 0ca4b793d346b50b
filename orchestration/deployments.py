"""The resources every job, asset and sensor gets, built from the validated settings, per named deployment.

As in Dagster's own reference projects, the deployment (`ONCEFLOW_DEPLOYMENT`: `local`, the default, or `prod`)
chooses the resources: `local` talks to the emulators when their hosts are set; `prod` talks to Google Cloud
only, names its projects explicitly and takes its one secret, a service-account key for BigQuery on hosts
without Application Default Credentials, through `dg.EnvVar`, so the key is read when a run starts and never
appears in a run's config or the UI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dagster as dg

from onceflow.resources.bigquery import BigQueryResource
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubResource
from onceflow.resources.settings import Settings, SettingsError
from onceflow.resources.spark import SparkResource

GCP_CREDENTIALS_VARIABLE = "ONCEFLOW_GCP_CREDENTIALS"


def resources_for(settings: Settings) -> dict[str, Any]:
    return DEPLOYMENTS[settings.deployment](settings)


def _local(settings: Settings) -> dict[str, Any]:
    return {
        **_compute(settings),
        "pubsub": PubSubResource(project=settings.pubsub_project, emulator_host=settings.pubsub_emulator_host),
        "bigquery": BigQueryResource(project=settings.bigquery_project, api_endpoint=settings.bigquery_emulator_host),
    }


def _prod(settings: Settings) -> dict[str, Any]:
    emulators = [name for name, host in (("PUBSUB_EMULATOR_HOST", settings.pubsub_emulator_host),
                                         ("BIGQUERY_EMULATOR_HOST", settings.bigquery_emulator_host)) if host]
    if emulators:
        raise SettingsError(f"ONCEFLOW_DEPLOYMENT=prod talks to Google Cloud only: unset {', '.join(emulators)}")
    if "pubsub_project" not in settings.model_fields_set:
        raise SettingsError("ONCEFLOW_DEPLOYMENT=prod needs ONCEFLOW_PUBSUB_PROJECT (the GCP project of the topics)")
    credentials = dg.EnvVar(GCP_CREDENTIALS_VARIABLE) if settings.gcp_credentials is not None else None
    return {
        **_compute(settings),
        "pubsub": PubSubResource(project=settings.pubsub_project, emulator_host=None),
        "bigquery": BigQueryResource(project=settings.bigquery_project, gcp_credentials=credentials),
    }


def _compute(settings: Settings) -> dict[str, Any]:
    return {
        "spark": SparkResource(master=settings.spark_master, remote=settings.spark_remote, ui_enabled=settings.spark_ui,
                               conf=settings.spark_conf, jars=list(settings.spark_jars)),
        "lake": LakeResource(home=settings.home_path, id_filters=settings.dedup_fast_path),
    }


DEPLOYMENTS: dict[str, Callable[[Settings], dict[str, Any]]] = {"local": _local, "prod": _prod}
