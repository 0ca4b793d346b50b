"""The shipped example `orders`: retail orders from Pub/Sub, sales per region every five minutes.

Its schema, keys, window size and aggregations differ from `events` on purpose: it is the template for
"Add your own pipeline" in the README. Messages on topic `onceflow-orders` carry a JSON body
`{"customer": ..., "region": ..., "amount": 12.34, "note": ...}` and attributes `order_id` and `ts`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow.jobs.declare.declaration import BigQuerySink, FileSink, PaneSink, Pipeline, WindowedOutput
from onceflow.jobs.declare.sources import PubSubSource
from onceflow.resources.settings import Settings


def region_sales(records: DataFrame) -> DataFrame:
    """One window's valid orders in, one row per region out."""
    return records.groupBy("region").agg(
        F.count("*").alias("orders"), F.sum("amount").alias("revenue"), F.countDistinct("customer").alias("customers")
    )


def orders_pipeline(settings: Settings) -> Pipeline:
    sinks: list[PaneSink] = [FileSink()]
    if settings.bigquery_dataset:
        sinks.append(BigQuerySink(table="region_sales"))
    return Pipeline(
        name="orders",
        source=PubSubSource(
            topic="onceflow-orders", subscription="onceflow-orders-sub", id_attribute="order_id", timestamp_attribute="ts"
        ),
        schema="customer STRING NOT NULL, region STRING NOT NULL, amount DECIMAL(18,2) NOT NULL, note STRING",
        dedup_horizon="1d",
        start_date="2026-11-01",
        outputs=[
            WindowedOutput(
                asset="region_sales",
                window="5m",
                allowed_lateness="1m",
                late_policy="drop",
                keys=["region"],
                transform=region_sales,
                sinks=sinks,
                description="Per five-minute window and region: orders, revenue, distinct customers.",
            )
        ],
    )
