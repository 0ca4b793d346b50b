"""A user's Kafka pipeline, loaded with `ONCEFLOW_PIPELINES=tests.kafka_pipelines`: the broker, topic, batch size,
what lost records become, the ID header (empty: IDs are positions) and where a new pipeline starts come from
`KAFKA_BOOTSTRAP`, `KAFKA_TOPIC`, `KAFKA_MAX_RECORDS`, `KAFKA_ON_LOST`, `KAFKA_ID_HEADER` and `KAFKA_STARTING`."""

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow import KafkaSource, Pipeline, WindowedOutput


def clicks_per_user(records: DataFrame) -> DataFrame:
    return records.groupBy("user").agg(F.count("*").alias("clicks"), F.sum("amount").alias("amount"))


def clicks_pipeline(delivery: str = "exactly_once") -> Pipeline:
    return Pipeline(
        name="clicks",
        source=KafkaSource(
            bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
            topic=os.environ.get("KAFKA_TOPIC", "clicks"),
            id_header=os.environ.get("KAFKA_ID_HEADER", "event_id") or None,
            timestamp_field="ts",
            max_records=int(os.environ.get("KAFKA_MAX_RECORDS", "1000")),
            on_lost_records=os.environ.get("KAFKA_ON_LOST", "fail"),
            starting_offsets=os.environ.get("KAFKA_STARTING", "earliest"),
        ),
        schema="user STRING NOT NULL, amount DECIMAL(10,2), page STRING",
        delivery=delivery,
        outputs=[WindowedOutput(asset="clicks_per_user", window="1m", keys=["user"], transform=clicks_per_user)],
    )


PIPELINES = [clicks_pipeline()]
