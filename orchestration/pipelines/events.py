"""The reference pipeline `events` (DESIGN section 7), declared with the public API like any user pipeline.

Pub/Sub topic `onceflow-events` (or, with `ONCEFLOW_EVENTS_SOURCE=files`, the `*.jsonl` files of
`ONCEFLOW_EVENTS_DIR`; with `kafka`, the Kafka topic `onceflow-events` on `ONCEFLOW_KAFKA_BOOTSTRAP`, the event
time as the record timestamp); records `{"key": string, "value": number}` with attributes (headers) `event_id` and
`event_time`;
per window and key, `count` and `sum_value`; with `ONCEFLOW_EVENTS_RECORDS`, every event to the record output
`events_clean`. Its whole declaration comes from `ONCEFLOW_*` settings.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow.jobs.declare.declaration import BigQuerySink, FileSink, PaneSink, Pipeline, WindowedOutput
from onceflow.jobs.declare.durations import render_duration
from onceflow.jobs.declare.kafka_sink import KafkaSink
from onceflow.jobs.declare.postgres_sink import PostgresSink
from onceflow.jobs.declare.record_output import RecordOutput
from onceflow.jobs.declare.sink import Sink
from onceflow.jobs.declare.sources import FileSource, KafkaSource, PubSubSource
from onceflow.resources.settings import Settings, SettingsError

# Values are exact decimals (BigQuery's NUMERIC): sums are then the same whatever order Spark adds them in.
SCHEMA = "key STRING NOT NULL, value DECIMAL(38, 9) NOT NULL"


def event_counts(records: DataFrame) -> DataFrame:
    """Per key: how many events the window holds, and the exact sum of their values."""
    return records.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("sum_value"))


def events_pipeline(settings: Settings) -> Pipeline:
    source: FileSource | PubSubSource | KafkaSource
    if settings.events_source == "files":
        source = FileSource(directory=settings.events_directory, id_field="event_id", timestamp_field="event_time")
    elif settings.events_source == "kafka":
        source = KafkaSource(bootstrap_servers=settings.kafka_bootstrap, topic="onceflow-events", id_header="event_id")
    else:
        source = PubSubSource(
            topic="onceflow-events",
            subscription="onceflow-events-sub",
            tracking_subscription="onceflow-events-tracking",
            id_attribute="event_id",
            timestamp_attribute="event_time",
        )
    sinks: list[PaneSink] = [FileSink()]
    if settings.bigquery_dataset:
        sinks.append(BigQuerySink(table="event_counts"))
    records = [RecordOutput(asset="events_clean", sinks=record_sinks(settings),
                            description="Every event once, as raw holds it.")] if settings.events_records else []
    return Pipeline(
        name="events",
        source=source,
        schema=SCHEMA,
        delivery=settings.delivery,
        dedup_horizon=render_duration(settings.dedup_horizon_s),
        start_date="2026-11-01",
        outputs=[
            WindowedOutput(
                asset="event_counts",
                window=render_duration(settings.window_s),
                allowed_lateness=render_duration(settings.allowed_lateness_s),
                late_policy=settings.late_policy,
                keys=["key"],
                transform=event_counts,
                sinks=sinks,
                description="Per event-time window and key: count and exact sum of `value`.",
            ),
            *records,
        ],
    )


def record_sinks(settings: Settings) -> list[Sink]:
    """The sinks `ONCEFLOW_EVENTS_RECORDS` names for `events_clean`."""
    sinks: list[Sink] = []
    for name in settings.events_records:
        if name == "postgres":
            if settings.events_postgres_dsn is None:
                raise SettingsError("ONCEFLOW_EVENTS_RECORDS names postgres: set ONCEFLOW_EVENTS_POSTGRES_DSN")
            sinks.append(PostgresSink(dsn=settings.events_postgres_dsn.get_secret_value(), table="events_clean"))
        elif name == "kafka":
            sinks.append(KafkaSink(bootstrap_servers=settings.kafka_bootstrap, topic="onceflow-events-clean",
                                   key="key"))
        elif name == "bigquery":
            if settings.bigquery_dataset is None:
                raise SettingsError("ONCEFLOW_EVENTS_RECORDS names bigquery: set ONCEFLOW_BIGQUERY_DATASET")
            sinks.append(BigQuerySink(table="events_clean"))
        else:
            sinks.append(FileSink(path=f"{settings.home_path}/published", format="parquet"))
    return sinks
