"""The chaos harness's pipelines (`ONCEFLOW_PIPELINES=tests.chaos.pipelines`): two shapes over Pub/Sub.

`events` is the built-in reference pipeline. `orders` is the shipped example reshaped for a run of minutes:
one-minute windows, two outputs (per region, and one row per window without keys).
"""

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow import FileSink, Pipeline, PubSubSource, WindowedOutput
from onceflow.orchestration.pipelines.events import events_pipeline
from onceflow.orchestration.pipelines.orders import region_sales
from onceflow.resources.settings import load_settings


def order_totals(records: DataFrame) -> DataFrame:
    return records.agg(F.count("*").alias("orders"), F.sum("amount").alias("revenue"))


orders = Pipeline(
    name="orders",
    # What the `declaration_change` fault's next release lowers (`tests.chaos.operator_faults`).
    max_record_bytes=int(os.environ.get("CHAOS_ORDERS_MAX_RECORD_BYTES", str(64 * 1024))),
    source=PubSubSource(topic="onceflow-orders", subscription="onceflow-orders-sub", id_attribute="order_id",
                        timestamp_attribute="ts"),
    schema="customer STRING NOT NULL, region STRING NOT NULL, amount DECIMAL(18,2) NOT NULL, note STRING",
    outputs=[
        WindowedOutput(asset="region_sales", window="1m", allowed_lateness="10s", keys=["region"],
                       transform=region_sales, sinks=[FileSink()]),
        WindowedOutput(asset="order_totals", window="1m", allowed_lateness="10s", transform=order_totals),
    ],
)

PIPELINES = [events_pipeline(load_settings()), orders]
