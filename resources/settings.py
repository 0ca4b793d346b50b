"""onceflow's settings: one typed, validated object read from `ONCEFLOW_*` variables (and the emulator hosts).

Every module that needs a setting takes it from `Settings` (built once per process edge: the Dagster code
location, the command line); nothing else reads the environment. A bad value fails at once with an error that
names the variable, e.g. `ONCEFLOW_MAX_MESSAGES='lots': Input should be a valid integer`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "ONCEFLOW_"
# The named points `ONCEFLOW_CRASH_AT` and `ONCEFLOW_PAUSE_AT` may name (`onceflow.resources.faults`).
FAULT_POINTS = frozenset(
    {
        "run.before_work",
        "watermark.after_drain",
        "watermark.before_ack",
        "land.before_persist",
        "land.after_persist",
        "ingest.after_plan",
        "ingest.after_dead_letters",
        "ingest.before_raw_commit",
        "ingest.after_merge",
        "ingest.append_staged",
        "window.after_close",
        "window.before_merge",
        "window.after_merge",
        "commit.after_write_sequence",
        "commit.after_step",
        "publish.before_stage",
        "sink.postgres.before_commit",
        "sink.kafka.before_commit",
        "sink.bigquery.before_commit",
    }
)
SUPPORTED_HOMES = "ONCEFLOW_HOME must be a local path or gs://bucket[/prefix] (Google Cloud Storage)"


class SettingsError(ValueError):
    """An `ONCEFLOW_*` (or emulator) variable has a value onceflow cannot use; the message names it."""


class Settings(BaseSettings):
    """Process-wide settings. Pipeline declarations fix their own semantics; these fill what they leave open.

    The `events` pipeline (the built-in reference) takes its whole declaration from here (`window_s`,
    `delivery`, `events_source`, ...); a user pipeline takes only the runtime knobs it leaves unset (batch
    bounds, watermark band and idle time, BigQuery dataset).
    """

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True)

    deployment: Literal["local", "prod"] = Field(
        default="local", description="Which resources the code location gets (`onceflow.orchestration.deployments`)."
    )
    home: str = Field(
        default=".onceflow",
        description="Root of the lake, landing files, checkpoints, commits: a local path or gs://bucket/prefix.",
    )
    pipelines: str | None = Field(default=None, description="`package.module` whose PIPELINES replace the built-ins.")
    jars_dir: str | None = Field(
        default=None,
        description="Jar cache: Delta's, Kafka's and onceflow's functions (default ~/.cache/onceflow/jars).",
    )
    bq_emulator_dir: str | None = Field(default=None, description="The BigQuery emulator's virtualenv cache.")

    spark_master: str = Field(
        default="local[2]", description="`local[N]`, `spark://host:port`, `k8s://...` or `yarn`; small-machine tuning "
        "(onceflow.resources.spark) on `local` only."
    )
    spark_remote: str | None = None
    spark_ui: bool = False
    spark_conf: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='Spark settings every engine onceflow starts gets, a JSON object: `{"spark.executor.memory": "4g"}`.',
    )
    spark_jars: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="Extra jars (comma-separated paths or URLs) beside Delta's and onceflow's own."
    )

    pubsub_project: str = "onceflow-local"
    pubsub_emulator_host: str | None = Field(
        default=None, validation_alias=AliasChoices("PUBSUB_EMULATOR_HOST", "ONCEFLOW_PUBSUB_EMULATOR_HOST")
    )
    bigquery_project: str | None = None
    bigquery_dataset: str | None = None
    bigquery_emulator_host: str | None = Field(
        default=None, validation_alias=AliasChoices("BIGQUERY_EMULATOR_HOST", "ONCEFLOW_BIGQUERY_EMULATOR_HOST")
    )
    gcp_credentials: SecretStr | None = Field(
        default=None, description="prod: a base64 service-account key for BigQuery, where ADC is not available."
    )
    storage_emulator_host: str | None = Field(
        default=None, validation_alias=AliasChoices("STORAGE_EMULATOR_HOST", "ONCEFLOW_STORAGE_EMULATOR_HOST"),
        description="A GCS emulator's URL (http://host:port): every store of a gs:// home talks to it instead.",
    )

    max_messages: int = Field(default=10_000, gt=0)
    max_seconds: float = Field(default=10.0, gt=0)
    max_bytes: int = Field(
        default=128 * 2**20, gt=0, description="Bytes (data and attributes) per Pub/Sub micro-batch, as well as messages."
    )
    pull_streams: int = Field(default=8, ge=1, le=64, description="Pub/Sub pull requests in flight per landing.")
    ack_deadline_s: int = Field(default=60, ge=1, le=600)
    max_files: int = Field(default=100, gt=0)
    watermark_band_s: int = Field(default=10, ge=0)
    watermark_idle_s: int = Field(default=120, gt=0)
    idle_tick_s: float = Field(default=15.0, gt=0)
    micro_batch_run_s: float = Field(
        default=0.0, ge=0, description="How long a micro-batch run keeps taking batches after its first (0: one)."
    )
    keep_warm_s: float = Field(
        default=0.0, ge=0, description="How long after a source's last batch its worker runs are still relayed by "
        "warm successors (0: one run's length): a batch after a quieter spell waits for a cold run's start.",
    )

    events_source: Literal["pubsub", "files", "kafka"] = "pubsub"
    kafka_bootstrap: str = Field(default="127.0.0.1:9092", description="The built-in `events` pipeline's Kafka brokers.")
    events_dir: str | None = None
    delivery: Literal["exactly_once", "at_least_once"] = "exactly_once"
    window_s: int = Field(default=60, ge=60)
    allowed_lateness_s: int = Field(default=30, ge=0)
    late_policy: Literal["drop", "refire"] = "drop"
    events_records: Annotated[tuple[Literal["postgres", "kafka", "bigquery", "files"], ...], NoDecode] = Field(
        default=(), description="The built-in `events` pipeline's record output `events_clean` and its sinks, "
        "comma-separated: `postgres` (table `events_clean` at `ONCEFLOW_EVENTS_POSTGRES_DSN`), `kafka` (topic "
        "`onceflow-events-clean` on `ONCEFLOW_KAFKA_BOOTSTRAP`), `bigquery` (table `events_clean` in "
        "`ONCEFLOW_BIGQUERY_DATASET`), `files` (Parquet under `<home>/published`).",
    )
    events_postgres_dsn: SecretStr | None = Field(default=None, description="The database of `events_clean`'s "
                                                  "`postgres` sink (a libpq connection string or URL).")
    dedup_horizon_s: int = Field(default=24 * 3600, gt=0)
    dedup_fast_path: bool = Field(default=True, description="An index of committed IDs' fingerprints (DESIGN 4, docs/dedup.md).")
    run_retention_h: float = Field(default=24.0, gt=0, description="Finished micro-batch runs are kept this long.")
    run_start_timeout_s: float = Field(
        default=180.0, gt=0, description="How long a run of onceflow's may wait, from its creation (or its launch) "
        "to the start of its work, before it counts as dead: its source and pool are released, and the sensors report "
        "it failed (a run killed in its first second).",
    )

    crash_at: str | None = Field(default=None, description="Fault injection: exit at `<point>[#k]`.")
    pause_at: str | None = Field(default=None, description="Fault injection: wait at `<point>[#k]` until released.")
    dagster_home: str | None = Field(default=None, validation_alias=AliasChoices("DAGSTER_HOME"))

    @field_validator("crash_at", "pause_at")
    @classmethod
    def _known_point(cls, value: str | None) -> str | None:
        if value:
            point, _, nth = value.partition("#")
            if point not in FAULT_POINTS or (nth and not nth.isdigit()):
                raise ValueError(f"unknown fault point {value!r} (points: {', '.join(sorted(FAULT_POINTS))}; `#k` "
                                 "optional)")
        return value or None

    @field_validator("spark_master")
    @classmethod
    def _spark_master(cls, value: str) -> str:
        if not re.fullmatch(r"local(-cluster)?(\[[^]]+\])?|(spark|k8s)://.+|yarn", value):
            raise ValueError("expected local[N], spark://host:port, k8s://https://host:port or yarn")
        return value

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _spark_conf(cls, value: object) -> dict[str, str]:
        return parse_spark_conf(value) if isinstance(value, str) else value  # type: ignore[return-value]

    @field_validator("spark_jars", "events_records", mode="before")
    @classmethod
    def _spark_jars(cls, value: object) -> object:
        return tuple(jar.strip() for jar in value.split(",") if jar.strip()) if isinstance(value, str) else value

    @field_validator("home")
    @classmethod
    def _supported_home(cls, value: str) -> str:
        # Every store must live where the home says: a scheme only some of them could reach would split it.
        scheme = value.partition("://")[0] if "://" in value else ""
        if scheme not in ("", "gs") or (scheme == "gs" and not value.removeprefix("gs://").strip("/")):
            raise ValueError(f"unsupported home {value!r}: {SUPPORTED_HOMES}")
        return value

    @property
    def home_path(self) -> str:
        """`home` as an absolute path (or the `gs://` URL as given)."""
        return self.home.rstrip("/") if "://" in self.home else str(Path(self.home).absolute())

    @property
    def events_directory(self) -> str:
        """Where the file-source variant of `events` reads: `ONCEFLOW_EVENTS_DIR`, else `<home>/incoming/events`."""
        return self.events_dir or f"{self.home_path}/incoming/events"


# Settings onceflow sets itself from other variables: taken from `ONCEFLOW_SPARK_CONF` they would drop them.
OWN_SPARK_KEYS = {"spark.master": "ONCEFLOW_SPARK_MASTER", "spark.remote": "ONCEFLOW_SPARK_REMOTE",
                  "spark.jars": "ONCEFLOW_SPARK_JARS"}


def parse_spark_conf(text: str) -> dict[str, str]:
    """`ONCEFLOW_SPARK_CONF`'s JSON object of `spark.*` keys; numbers and booleans become Spark's spelling."""
    try:
        conf = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as error:
        raise ValueError(f'not a JSON object of Spark settings (like {{"spark.executor.memory": "4g"}}): {error}') from None
    if not isinstance(conf, dict):
        raise ValueError('expected a JSON object of Spark settings, like {"spark.executor.memory": "4g"}')
    parsed = {}
    for key, value in conf.items():
        if not key.startswith("spark."):
            raise ValueError(f"{key!r} is not a Spark setting (keys start with `spark.`)")
        if key in OWN_SPARK_KEYS:
            raise ValueError(f"{key!r} comes from {OWN_SPARK_KEYS[key]}, not from here")
        if isinstance(value, bool):
            parsed[key] = str(value).lower()
        elif isinstance(value, str | int | float):
            parsed[key] = str(value)
        else:
            raise ValueError(f"{key!r}: a value is a string, a number or a boolean, not {json.dumps(value)}")
    return parsed


def load_settings(**overrides: object) -> Settings:
    """Read and validate the settings from the process environment; `overrides` (field names) take precedence,
    for the few a code location's own configuration fixes (a `dg` component's `deployment`)."""
    return _validated(tuple(sorted(os.environ.items())), tuple(sorted(overrides.items())))


@functools.lru_cache(maxsize=8)
def _validated(environment: tuple[tuple[str, str], ...], overrides: tuple[tuple[str, object], ...]) -> Settings:
    """The settings of one state of the environment (its items, which `Settings` reads again): a batch asks for
    them at each of its steps, and validating them each time cost a batch more than its checkpoint did. An invalid
    environment is not kept."""
    try:
        return Settings(**dict(overrides))
    except ValidationError as error:
        raise SettingsError("; ".join(_describe(e) for e in error.errors())) from None


def _describe(error: Mapping) -> str:
    loc = str(error["loc"][0]) if error.get("loc") else "?"
    variable = loc if loc.isupper() else f"{PREFIX}{loc.upper()}"
    return f"{variable}={error.get('input')!r}: {error['msg']}"
