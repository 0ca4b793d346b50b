"""A user's pipeline with a record output, loaded with `ONCEFLOW_PIPELINES=tests.record_pipelines`: DESIGN 6b's
example on files, its sinks a real PostgreSQL (`ORDERS_DSN`, read through `dg.EnvVar`), a real Kafka broker
(`KAFKA_BOOTSTRAP`, `ORDERS_TOPIC`), Parquet files (`ORDERS_OUT`) and the BigQuery emulator (the dataset
`ORDERS_BQ_DATASET`, the endpoint `BIGQUERY_EMULATOR_HOST`)."""

import os

import dagster as dg
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow import BigQuerySink, FileSink, FileSource, KafkaSink, Pipeline, PostgresSink, RecordOutput


def with_total(records: DataFrame) -> DataFrame:
    """Row-wise and deterministic: filter, project."""
    return records.where(F.col("qty") > 0).select(
        "record_id", "event_time", F.col("record_id").alias("order_id"), "shop",
        (F.col("qty") * F.col("price")).alias("total"))


orders = Pipeline(
    name="orders",
    source=FileSource(directory=os.environ.get("ORDERS_DIR", "/data/orders"), id_field="order_id",
                      timestamp_field="ts"),
    schema="shop STRING NOT NULL, qty INT NOT NULL, price DECIMAL(10,2) NOT NULL",
    outputs=[
        RecordOutput(asset="orders_clean", transform=with_total, sinks=[
            PostgresSink(dsn=dg.EnvVar("ORDERS_DSN"), table="orders", mode="upsert", key=["order_id"]),
            PostgresSink(dsn=dg.EnvVar("ORDERS_DSN"), table="order_log"),
            KafkaSink(bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
                      topic=os.environ.get("ORDERS_TOPIC", "orders-clean"), key="order_id"),
            FileSink(path=os.environ.get("ORDERS_OUT", "/data/out"), format="parquet"),
            BigQuerySink(table="orders_clean", dataset=os.environ.get("ORDERS_BQ_DATASET", "orders")),
        ]),
    ],
)

PIPELINES = [orders]
