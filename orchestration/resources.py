"""The resources every job and asset gets, chosen by the environment (`ONCEFLOW_*`, `PUBSUB_EMULATOR_HOST`,
`BIGQUERY_EMULATOR_HOST`)."""

from __future__ import annotations

from typing import Any

from resources.bigquery import BigQueryResource
from resources.lake import LakeResource
from resources.pubsub import PubSubResource
from resources.spark import SparkResource


def resources_from_env() -> dict[str, Any]:
    return {
        "spark": SparkResource.from_env(),
        "lake": LakeResource.from_env(),
        "pubsub": PubSubResource.from_env(),
        "bigquery": BigQueryResource.from_env(),
    }
