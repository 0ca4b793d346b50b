"""A user's pipelines module, loaded with `ONCEFLOW_PIPELINES=tests.user_pipelines`.

`orders` is DESIGN section 6a's example exactly as written, except that its directory comes from `ORDERS_DIR`
(the test's own files). `clicks` adds a second pipeline with two outputs of other window sizes, one without keys.
"""

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow import BigQuerySink, FileSink, FileSource, Pipeline, WindowedOutput


def region_sales(records: DataFrame) -> DataFrame:
    """One window's valid records in, one row per key out. Runs on pinned input, so it must be deterministic."""
    return records.groupBy("region").agg(
        F.count("*").alias("orders"), F.sum("amount").alias("revenue"), F.countDistinct("customer").alias("customers"))


orders = Pipeline(
    name="orders",
    source=FileSource(directory=os.environ.get("ORDERS_DIR", "/data/orders"), pattern="*.jsonl", id_field="order_id",
                      timestamp_field="ts"),
    schema="customer STRING NOT NULL, region STRING NOT NULL, amount DECIMAL(18,2) NOT NULL, note STRING",
    delivery="exactly_once",            # or "at_least_once"
    dedup_horizon="1d",
    max_dead_letter_rate=0.2,           # the raw asset's check fails on a batch of more dead letters than this
    outputs=[
        WindowedOutput(asset="region_sales", window="5m", allowed_lateness="1m", late_policy="drop",
                       keys=["region"], transform=region_sales, sinks=[FileSink(), BigQuerySink(table="region_sales")]),
    ],
)


def page_views(records: DataFrame) -> DataFrame:
    return records.groupBy("page").agg(F.count("*").alias("views"), F.max("ms").alias("slowest_ms"))


def daily_users(records: DataFrame) -> DataFrame:
    return records.agg(F.countDistinct("user").alias("users"), F.count("*").alias("clicks"))


clicks = Pipeline(
    name="clicks",
    source=FileSource(directory=os.environ.get("CLICKS_DIR", "/data/clicks"), id_field="click_id", timestamp_field="at"),
    schema="user STRING NOT NULL, page STRING NOT NULL, ms INT, tags ARRAY<STRING>",
    outputs=[
        WindowedOutput(asset="page_views", window="1h", keys=["page"], transform=page_views, sinks=[FileSink()]),
        WindowedOutput(asset="daily_users", window="1d", transform=daily_users),
    ],
)

PIPELINES = [orders, clicks]
