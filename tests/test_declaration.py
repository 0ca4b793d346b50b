"""Declarations and settings: every mistake fails at load, naming the pipeline and the field (or the variable)."""

from __future__ import annotations

import dataclasses
import sys
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import types as T

from onceflow import (
    BigQuerySink,
    DeclarationError,
    FileSink,
    FileSource,
    KafkaSource,
    Pipeline,
    PubSubSource,
    WindowedOutput,
)
from onceflow.jobs.declare.durations import check_window_size, parse_duration, window_cron
from onceflow.jobs.declare.schema import SchemaError, parse_schema
from onceflow.jobs.publish.sink_types import sink_type
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.orchestration.pipelines.transform_check import check_transform_output
from onceflow.resources.settings import SettingsError, load_settings


def same(records):  # a transform for declarations that are never run
    return records


def orders(**changes) -> Pipeline:
    output = dict(asset="region_sales", window="5m", keys=["region"], transform=same)
    output.update(changes.pop("output", {}))
    fields = dict(
        name="orders",
        source=FileSource(directory="/in", timestamp_field="ts"),
        schema="customer STRING NOT NULL, region STRING NOT NULL, amount DECIMAL(18,2) NOT NULL",
        outputs=[WindowedOutput(**output)],
    )
    fields.update(changes)
    return Pipeline(**fields)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema": "customer STRNG"}, "pipeline 'orders': schema: field 'customer': unknown type 'STRNG'"),
        ({"schema": "amount DECIMAL(40, 2)"}, "schema: field 'amount': DECIMAL(40, 2) needs"),
        ({"schema": "a INT, a STRING"}, "schema: field 'a' is declared twice"),
        ({"schema": "record_id STRING"}, "schema: field 'record_id' is a column name onceflow uses itself"),
        ({"schema": "data STRUCT<a: INT>"}, "schema: field 'data' is a column name onceflow uses itself"),
        ({"schema": "reason STRING"}, "schema: field 'reason' is a column name onceflow uses itself"),
        ({"schema": "blob BINARY"}, "BINARY cannot come from JSON"),
        ({"schema": "Amount DECIMAL(18,2), amount DECIMAL(18,2)"},
         "pipeline 'orders': schema: fields 'Amount' and 'amount' differ only in case"),
        ({"schema": "s STRUCT<id: INT, ID: STRING>"}, "schema: fields 'id' and 'ID' of field 's' differ only in case"),
        ({"schema": "s STRUCT<id: INT, id: STRING>"}, "schema: field 'id' of field 's' is declared twice"),
        ({"schema": "Record_ID STRING"}, "schema: field 'Record_ID' is a column name onceflow uses itself"),
        ({"schema": "`a.b` STRING"}, "schema: field name 'a.b': use letters, digits and '_' (not starting with a "
                                     "digit); a JSON key spelled otherwise is not a column, it stays in `payload`"),
        ({"schema": "`it's` STRING"}, "schema: field name \"it's\": use letters"),
        ({"schema": "`a[0]` STRING"}, "schema: field name 'a[0]': use letters"),
        ({"source": FileSource(directory="/in", timestamp_field="ts", pattern="*.jsonl.gz")},
         "pipeline 'orders': source.pattern: '*.jsonl.gz': compressed files are not read"),
        ({"source": FileSource(directory="/in", timestamp_field="ts", pattern="orders-*.JSON.ZST")},
         "source.pattern: 'orders-*.JSON.ZST': compressed files are not read"),
        ({"source": FileSource(directory="/in", timestamp_field="ts", pattern="**/*.jsonl")},
         "source.pattern: '**/*.jsonl': a pattern matches a file's name, or its name and the directories right above"),
        ({"source": FileSource(directory="/in", timestamp_field="ts", pattern="../*.jsonl")},
         "source.pattern: '../*.jsonl': a pattern matches"),
        ({"delivery": "twice"}, "pipeline 'orders': delivery: 'twice' is not a delivery mode"),
        ({"dedup_horizon": "a day"}, "pipeline 'orders': dedup_horizon: 'a day' is not a duration"),
        ({"max_clock_skew": "5"}, "pipeline 'orders': max_clock_skew: '5' is not a duration"),
        ({"time_bucket": "30s"}, "pipeline 'orders': time_bucket: '30s': a bucket is at least a minute"),
        ({"time_bucket": "daily"}, "pipeline 'orders': time_bucket: 'daily' is not a duration"),
        ({"start_date": "2026-13-01"}, "pipeline 'orders': start_date: '2026-13-01' is not a date"),
        ({"name": "Orders!"}, "pipeline 'Orders!': name: use lowercase letters"),
        ({"output": {"window": "7m"}}, "outputs[0] ('region_sales').window: '7m': 420s is not a window size"),
        ({"output": {"window": "30s"}}, "window: '30s': 30s is not a window size"),
        ({"output": {"window": "5h"}}, "window: '5h'"),
        ({"output": {"allowed_lateness": "1 minuet"}}, "outputs[0] ('region_sales').allowed_lateness: '1 minuet'"),
        ({"output": {"allowed_lateness": timedelta(milliseconds=1500)}}, "allowed_lateness: datetime.timedelta("),
        ({"output": {"sinks": "files"}}, "sinks[0]: str is not a sink: use FileSink or BigQuerySink"),
        ({"output": {"keys": 5}}, "keys: 5 is not a column name"),
        ({"schema": T.StructType()}, "schema: StructType([]) is not a record schema"),
        ({"schema": None}, "schema: NoneType is not a schema: give Spark DDL"),
        ({"output": {"sinks": [BigQuerySink(table="a.b.c.d")]}}, "sinks[0]: project 'a.b' is not a Google Cloud project id"),
        ({"output": {"late_policy": "keep"}}, "late_policy: 'keep' is not a late policy"),
        ({"output": {"keys": ["pane"]}}, "keys: 'pane' is a column onceflow adds itself"),
        ({"output": {"asset": "Region-Sales"}}, "asset: use lowercase letters"),
        ({"output": {"transform": "region_sales"}}, "transform: 'region_sales' is not a function"),
        ({"output": {"sinks": [FileSink(), FileSink()]}}, "more than one FileSink"),
        ({"output": {"sinks": [BigQuerySink(table="bad-name")]}}, "sinks[0]: table 'bad-name' is not a BigQuery name"),
        ({"source": PubSubSource(topic="t", subscription="orders-sub")}, "source.topic: 't' is not a Pub/Sub name"),
        ({"source": FileSource(directory="/in", timestamp_field="t s")}, "source.timestamp_field: 't s'"),
        ({"source": KafkaSource(bootstrap_servers="nohost", topic="orders")},
         "pipeline 'orders': source.bootstrap_servers: 'nohost': give host:port"),
        ({"source": KafkaSource(bootstrap_servers=["b1:9092", "b 2:9092"], topic="orders")},
         "source.bootstrap_servers"),
        ({"source": KafkaSource(bootstrap_servers="b:9092", topic="or ders")}, "source.topic: 'or ders' is not a Kafka"),
        ({"source": KafkaSource(bootstrap_servers="b:9092", topic="o", id_header="id", id_field="id")},
         "source.id_header: declare id_header or id_field, not both"),
        ({"source": KafkaSource(bootstrap_servers="b:9092", topic="o", starting_offsets="now")},
         "source.starting_offsets: 'now': use 'earliest' or 'latest'"),
        ({"source": KafkaSource(bootstrap_servers="b:9092", topic="o", on_lost_records="skip")},
         "source.on_lost_records: 'skip'"),
        ({"source": KafkaSource(bootstrap_servers="b:9092", topic="o", options={"group.id": "mine"})},
         "source.options['group.id']: onceflow sets 'group.id' itself"),
        ({"source": KafkaSource(bootstrap_servers="b:9092", topic="o", max_records=0)}, "source.max_records: 0 must"),
        ({"source": KafkaSource(bootstrap_servers="b:9092", topic="o"), "schema": "kafka_key STRING"},
         "schema: field 'kafka_key' is a column name onceflow uses itself"),
    ],
)
def test_a_declaration_mistake_names_the_pipeline_and_the_field(changes: dict, message: str) -> None:
    with pytest.raises(DeclarationError) as raised:
        orders(**changes)
    assert message in str(raised.value)


def test_durations_and_window_sizes() -> None:
    assert [parse_duration(d) for d in ("30s", "5m", "1h", "1d")] == [30, 300, 3600, 86400]
    assert [parse_duration(d) for d in ("30 seconds", "5 minutes", "1 Hour", "2 days", "10min")] == [
        30, 300, 3600, 172800, 600]
    assert parse_duration(timedelta(minutes=90)) == 5400
    sizes = [s for s in range(60, 86401, 60) if _is_window(s)]
    assert sizes == [60, 120, 180, 240, 300, 360, 600, 720, 900, 1200, 1800, 3600, 7200, 10800, 14400, 21600,
                     28800, 43200, 86400]
    assert [window_cron(s) for s in (60, 300, 3600, 21600, 86400)] == [
        "* * * * *", "*/5 * * * *", "0 * * * *", "0 */6 * * *", "0 0 * * *"
    ]


def test_what_users_write_means_what_they_meant() -> None:
    """A duration in words or as a timedelta, one key or one sink alone, a StructType schema and a qualified
    BigQuery table are taken as meant, each stored in one form."""
    schema = T.StructType([T.StructField("customer", T.StringType(), False),
                           T.StructField("region", T.StringType(), False),
                           T.StructField("amount", T.DecimalType(18, 2), False)])
    pipeline = orders(schema=schema, dedup_horizon=timedelta(hours=12), time_bucket="1 day",
                      output={"window": "5 minutes", "allowed_lateness": timedelta(seconds=30), "keys": "region",
                              "sinks": BigQuerySink(table="proj-1.sales.region_sales")})
    assert pipeline == orders(dedup_horizon="12h", time_bucket="1d", output={
        "allowed_lateness": "30s", "sinks": [BigQuerySink(table="region_sales", dataset="sales", project="proj-1")]})
    (output,) = pipeline.outputs
    assert (output.window, output.window_s, output.keys) == ("5m", 300, ("region",))
    assert pipeline.record_schema == schema
    assert orders(outputs=WindowedOutput(asset="a", window="1h", transform=same)).outputs[0].asset == "a"
    assert BigQuerySink(table="sales.t") == BigQuerySink(table="t", dataset="sales")
    with pytest.raises(DeclarationError, match=r"table 'p\.sales\.t' names dataset 'sales', but dataset='other'"):
        BigQuerySink(table="p.sales.t", dataset="other")


def test_a_bad_window_names_its_field_once() -> None:
    with pytest.raises(DeclarationError) as raised:
        orders(output={"window": "7 minutes"})
    assert str(raised.value) == (
        "pipeline 'orders': outputs[0] ('region_sales').window: '7m': 420s is not a window size: windows are 1m to "
        "1d, in minutes that divide an hour (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30) or hours that divide a day "
        "(1, 2, 3, 4, 6, 8, 12, 24)")
    with pytest.raises(DeclarationError) as raised:
        orders(output={"window": "5 minuets"})
    assert str(raised.value).count("pipeline 'orders'") == 1 and str(raised.value).count(".window:") == 1


def _is_window(seconds: int) -> bool:
    try:
        check_window_size(seconds)
    except ValueError:
        return False
    return True


def test_schemas_parse_without_spark_and_map_to_bigquery() -> None:
    schema = parse_schema(
        "customer STRING NOT NULL, amount DECIMAL(18,2) NOT NULL COMMENT 'euros', n BIGINT, at TIMESTAMP, "
        "tags ARRAY<STRING>, attrs MAP<STRING, INT>, geo STRUCT<lat: DOUBLE, lon DOUBLE NOT NULL>, raw VARIANT"
    )
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in schema] == [
        ("customer", "string", False), ("amount", "decimal(18,2)", False), ("n", "bigint", True),
        ("at", "timestamp", True), ("tags", "array<string>", True), ("attrs", "map<string,int>", True),
        ("geo", "struct<lat:double,lon:double>", True), ("raw", "variant", True),
    ]
    with pytest.raises(SchemaError, match="MAP keys must be STRING"):
        parse_schema("m MAP<INT, INT>")
    assert [str(sink_type(t)) for t in (T.LongType(), T.DecimalType(38, 9), T.DecimalType(38, 10), T.DoubleType(),
                                         T.TimestampType(), T.TimestampNTZType(), T.DateType(), T.BooleanType())] == [
        "INT64", "NUMERIC", "BIGNUMERIC", "FLOAT64", "TIMESTAMP", "DATETIME", "DATE", "BOOL"
    ]
    assert [str(sink_type(f.dataType)) for f in schema][4:] == [
        "ARRAY<STRING>", "MAP<STRING, INT64>", "STRUCT<lat FLOAT64, lon FLOAT64>", "JSON"
    ]


def test_a_transform_output_without_a_declared_key_fails_naming_it() -> None:
    pipeline = orders()
    output = pipeline.outputs[0]
    columns = T.StructType([T.StructField("area", T.StringType()), T.StructField("orders", T.LongType())])
    with pytest.raises(DeclarationError, match=r"pipeline 'orders': output 'region_sales': key 'region' is not a "
                                               r"column of the transform's output \(area, orders\)"):
        check_transform_output(pipeline, output, columns)
    reserved = T.StructType([T.StructField("region", T.StringType()), T.StructField("pane", T.IntegerType())])
    with pytest.raises(DeclarationError, match="outputs 'pane', a column onceflow adds itself"):
        check_transform_output(pipeline, output, reserved)
    to_files = dataclasses.replace(output, sinks=[FileSink()])
    binary = T.StructType([T.StructField("region", T.StringType()), T.StructField("b", T.BinaryType())])
    with pytest.raises(DeclarationError, match="pipeline 'orders': output 'region_sales': output column 'b': "
                                               "binary has no column type in the sinks"):
        check_transform_output(pipeline, to_files, binary)
    # An array of arrays goes to files, but BigQuery's arrays cannot hold arrays.
    nested = T.StructType([T.StructField("region", T.StringType()),
                           T.StructField("l", T.ArrayType(T.ArrayType(T.LongType())))])
    check_transform_output(pipeline, to_files, nested)
    with pytest.raises(DeclarationError, match="pipeline 'orders': output 'region_sales': output column 'l': "
                                               "column 'l': ARRAY<ARRAY<INT64>>: BigQuery arrays cannot hold arrays"):
        check_transform_output(pipeline, dataclasses.replace(output, sinks=[BigQuerySink(table="t")]), nested)


def test_a_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_MAX_MESSAGES", "lots")
    monkeypatch.setenv("ONCEFLOW_LATE_POLICY", "keep")
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert "ONCEFLOW_MAX_MESSAGES='lots'" in str(raised.value) and "ONCEFLOW_LATE_POLICY='keep'" in str(raised.value)
    monkeypatch.delenv("ONCEFLOW_MAX_MESSAGES")
    monkeypatch.delenv("ONCEFLOW_LATE_POLICY")
    monkeypatch.setenv("ONCEFLOW_CRASH_AT", "ingest.before_everything")
    with pytest.raises(SettingsError, match=r"ONCEFLOW_CRASH_AT='ingest\.before_everything': .*unknown fault point"):
        load_settings()


def test_open_knobs_come_from_settings_and_declared_ones_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_MAX_MESSAGES", "123")
    monkeypatch.setenv("ONCEFLOW_WATERMARK_BAND_S", "3")
    monkeypatch.setenv("ONCEFLOW_BIGQUERY_DATASET", "sales")
    monkeypatch.setenv("ONCEFLOW_PIPELINES", "tests.user_pipelines")
    monkeypatch.delenv("BIGQUERY_EMULATOR_HOST", raising=False)  # else it is the sinks' endpoint
    orders, clicks = load_pipelines(load_settings())
    assert orders.source.max_files == 100 and orders.watermark_band == "3s" and orders.watermark_idle == "2m"
    assert orders.outputs[0].sinks[1] == BigQuerySink(table="region_sales", dataset="sales", project=None)
    assert [o.asset for o in clicks.outputs] == ["page_views", "daily_users"]
    monkeypatch.delenv("ONCEFLOW_BIGQUERY_DATASET")
    with pytest.raises(DeclarationError, match=r"pipeline 'orders': outputs\[0\].sinks\[1\]: BigQuerySink\(table="
                                               r"'region_sales'\) has no dataset"):
        load_pipelines(load_settings())


def test_pipelines_module_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "no_list.py").write_text("PIPELINES = 'orders'\n")
    (tmp_path / "twice.py").write_text(
        "from tests.user_pipelines import orders\nPIPELINES = [orders, orders]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ONCEFLOW_BIGQUERY_DATASET", "sales")
    for module, message in (
        ("not.a.module", "ONCEFLOW_PIPELINES='not.a.module': cannot import it"),
        ("no_list", "ONCEFLOW_PIPELINES='no_list': the module must define PIPELINES"),
        ("twice", "pipeline 'orders': name: two pipelines have this name"),
    ):
        monkeypatch.setenv("ONCEFLOW_PIPELINES", module)
        with pytest.raises((SettingsError, DeclarationError), match=message):
            load_pipelines(load_settings())
    sys.modules.pop("no_list", None)
    sys.modules.pop("twice", None)


def test_kafka_secrets_come_from_the_environment_and_are_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    source = KafkaSource(bootstrap_servers="b:9092", topic="o",
                         options={"security.protocol": "SASL_SSL", "sasl.password": dg.EnvVar("KAFKA_SECRET")})
    monkeypatch.setenv("KAFKA_SECRET", "s3cret")
    assert source.consumer_options() == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret"}
    assert "s3cret" not in repr(orders(source=source))
