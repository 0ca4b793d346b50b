"""The Spark session: local by default, a `spark://` cluster or a Spark Connect server when configured.

Every engine gets Delta's SQL extension and catalog, UTC as its time zone, Delta's jars, Spark's Kafka connector
and onceflow's own (`spark.jars`, which Spark ships to the executors), the user's extra jars and Spark settings
(`ONCEFLOW_SPARK_JARS`, `ONCEFLOW_SPARK_CONF`); a `local` master also gets settings that suit a small machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg
from pydantic import Field
from pyspark.sql import SparkSession

from onceflow.resources.class_archive import class_archive_options
from onceflow.resources.delta_jars import ensure_delta_jars, ensure_gcs_connector_jar
from onceflow.resources.gcs import hadoop_gcs_conf, spark_gcs_conf
from onceflow.resources.kafka_jars import ensure_spark_kafka_jars
from onceflow.resources.settings import load_settings
from onceflow.resources.spark_functions import ensure_spark_functions_jar

# Tuning for a `local` master on a small machine; a cluster keeps Spark's defaults (and the user's settings).
# Delta reconstructs table state with this many tasks; its default of 50 is mostly task overhead on a few cores.
SMALL_MACHINE_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    # VACUUM lists a table in this many tasks; Spark's default (10,000) is mostly task overhead on a few cores.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    # Adaptive execution runs each shuffle and each first use of a cached plan as a job of its own and re-plans
    # between them: on micro-batches that costs more than it finds.
    "spark.sql.adaptive.enabled": "false",
}
ENGINE_CONF = {
    # Windows and time buckets are UTC whatever the machine's zone: a correctness setting, on every engine.
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Ingest caches each batch once, reads it twice and drops it: on a micro-batch, compressing it cost more than it
    # saved.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # The parallel collector: a driver here is a throughput engine on a small heap, and G1's concurrent threads and
    # write barriers took CPU from its two cores. Realistic exactly-once ran 5-10 % faster against the same peer
    # (bench/run.py --dataset realistic, alternating runs: exactly-once ÷ peer medians 2.58 and 2.59 against 2.32
    # and 1.93); a driver started no slower.
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=warn -XX:+UseParallelGC",
    # Spark keeps 100 plans' generated code by default: a warm engine serving many runs' batches, windows and checks
    # compiled the same plans again and again (Janino, then the JIT: half the engine's CPU). 2,000 entries cut
    # the wall time of the window and commit-sensor tests by 12 %.
    "spark.sql.codegen.cache.maxEntries": "2000",
}
# Columns of onceflow's tables that hold a different value for every record: a Parquet dictionary of them is never
# smaller than the values themselves, and building one is work every append pays for nothing.
PER_RECORD_COLUMNS = ("record_id", "payload", "source_position")
PARQUET_CONF = {f"spark.hadoop.parquet.enable.dictionary#{column}": "false" for column in PER_RECORD_COLUMNS}
# A run's own classic session lives only as long as the run: its driver JVM compiles with C1 alone, which cuts the
# CPU it burns warming up before its first commit; C2 pays off in long-lived engines (a Connect server, the bench).
RUN_DRIVER_CONF = {"spark.driver.extraJavaOptions": f"{ENGINE_CONF['spark.driver.extraJavaOptions']} -XX:TieredStopAtLevel=1"}
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def engine_jars(extra: Sequence[str] = ()) -> list[str]:
    """The jars every onceflow Spark engine loads: Delta's, the GCS connector (so any engine can serve a `gs://`
    home), Spark's Kafka connector (Kafka sources) and onceflow's own functions (cached after set-up), then the
    user's `extra` ones (paths or URLs)."""
    jars = [*ensure_delta_jars(), ensure_gcs_connector_jar(), *ensure_spark_kafka_jars(), ensure_spark_functions_jar()]
    return [*map(str, jars), *extra]


def engine_conf(master: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings of an engine on `master` (its jars apart): onceflow's, the GCS connector's, then the
    user's `conf` on top; its driver JVM maps the class archive once `onceflow setup` made it."""
    small = SMALL_MACHINE_CONF if master.startswith("local") else {}
    settings = {**small, **ENGINE_CONF, **PARQUET_CONF, **DELTA_CONF, **spark_gcs_conf(), **(conf or {})}
    options = f"{settings.get('spark.driver.extraJavaOptions', '')} {class_archive_options()}"
    return {**settings, "spark.driver.extraJavaOptions": options.strip()}


def build_spark_session(
    master: str = "local[2]",
    remote: str | None = None,
    app_name: str = "onceflow",
    ui_enabled: bool = False,
    conf: Mapping[str, str] | None = None,
    jars: Sequence[str] = (),
) -> SparkSession:
    """Create (or reuse) the process's Spark session.

    With `remote` (`sc://host:port`) the session is a Spark Connect client of a server that already has Delta
    configured (`conf` and `jars` are the server's, given when it started); otherwise a classic session on
    `master` (`local[N]` or `spark://host:port`) is built with `engine_conf` and `engine_jars`.
    """
    if remote:
        session = SparkSession.builder.remote(remote).getOrCreate()
        try:
            # A server's default zone is its own; windows and buckets are UTC whatever server this is.
            session.conf.set("spark.sql.session.timeZone", "UTC")
        except Exception:  # the cached session is of an engine that restarted since: start anew
            session = SparkSession.builder.remote(remote).create()
            session.conf.set("spark.sql.session.timeZone", "UTC")
        return with_gcs_settings(session)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.ui.enabled": str(ui_enabled).lower(),
        **engine_conf(master, conf),
        "spark.jars": ",".join(engine_jars(jars)),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    # A Py4J reply over 8 KiB waited for the client's delayed ACK (`Py4JNoDelay.java`); where this JDK hides a thread's
    # connection (-1), calls stay correct, and only slower.
    session._jvm.io.onceflow.Py4JNoDelay.apply()
    return with_gcs_settings(session)


def with_gcs_settings(session: SparkSession) -> SparkSession:
    """On a `gs://` home, the session's Hadoop `fs.gs.*` settings for this process's settings (the emulator's URL
    or none): an engine started before them (a warm server, a reused session) then reaches the same storage."""
    settings = load_settings()
    if settings.home_path.startswith("gs://"):
        # Session settings reach the Hadoop configuration of every file system this session's queries open.
        for key, value in hadoop_gcs_conf(settings.storage_emulator_host).items():
            session.conf.set(key, value)
    return session


class SparkResource(dg.ConfigurableResource):
    """Hands out the Spark session that ops and assets run their Spark work on."""

    master: str = Field(default="local[2]", description="Spark master: local[N] or spark://host:port.")
    remote: str | None = Field(default=None, description="Spark Connect URL (sc://host:port); overrides master.")
    app_name: str = "onceflow"
    ui_enabled: bool = False
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings (`ONCEFLOW_SPARK_CONF`).")
    jars: list[str] = Field(default_factory=list, description="Extra jars (`ONCEFLOW_SPARK_JARS`).")

    def get_session(self) -> SparkSession:
        """The run's session (see `build_spark_session`); a classic one is tuned to live as long as its run."""
        conf = {**RUN_DRIVER_CONF, **self.conf}
        return build_spark_session(self.master, self.remote, self.app_name, self.ui_enabled, conf, self.jars)
