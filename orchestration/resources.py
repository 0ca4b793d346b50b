"""The resources every job, asset and sensor gets, built from the validated settings."""

from __future__ import annotations

from typing import Any

from resources.bigquery import BigQueryResource
from resources.lake import LakeResource
from resources.pubsub import PubSubResource
from resources.settings import Settings
from resources.spark import SparkResource


def resources_for(settings: Settings) -> dict[str, Any]:
    return {
        "spark": SparkResource(master=settings.spark_master, remote=settings.spark_remote, ui_enabled=settings.spark_ui,
                               conf=settings.spark_conf, jars=list(settings.spark_jars)),
        "lake": LakeResource(home=settings.home_path, id_filters=settings.dedup_fast_path),
        "pubsub": PubSubResource(project=settings.pubsub_project, emulator_host=settings.pubsub_emulator_host),
        "bigquery": BigQueryResource(project=settings.bigquery_project, api_endpoint=settings.bigquery_emulator_host),
    }
