"""onceflow's settings: one typed, validated object read from `ONCEFLOW_*` variables (and the emulator hosts).

Every module that needs a setting takes it from `Settings` (built once per process edge: the Dagster code
location, the command line); nothing else reads the environment. A bad value fails at once with an error that
names the variable, e.g. `ONCEFLOW_MAX_MESSAGES='lots': Input should be a valid integer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from resources.faults import POINTS

PREFIX = "ONCEFLOW_"


class SettingsError(ValueError):
    """An `ONCEFLOW_*` (or emulator) variable has a value onceflow cannot use; the message names it."""


class Settings(BaseSettings):
    """Process-wide settings. Pipeline declarations fix their own semantics; these fill what they leave open.

    The `events` pipeline (the built-in reference) takes its whole declaration from here (`window_s`,
    `delivery`, `events_source`, ...); a user pipeline takes only the runtime knobs it leaves unset (batch
    bounds, watermark band and idle time, BigQuery dataset).
    """

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True)

    home: str = Field(default=".onceflow", description="Root of the lake, landing files, checkpoints, commits.")
    pipelines: str | None = Field(default=None, description="`package.module` whose PIPELINES replace the built-ins.")
    jars_dir: str | None = Field(
        default=None, description="Jar cache: Delta's and onceflow's functions (default ~/.cache/onceflow/jars)."
    )
    bq_emulator_dir: str | None = Field(default=None, description="The BigQuery emulator's virtualenv cache.")

    spark_master: str = "local[2]"
    spark_remote: str | None = None
    spark_ui: bool = False

    pubsub_project: str = "onceflow-local"
    pubsub_emulator_host: str | None = Field(
        default=None, validation_alias=AliasChoices("PUBSUB_EMULATOR_HOST", "ONCEFLOW_PUBSUB_EMULATOR_HOST")
    )
    bigquery_project: str | None = None
    bigquery_dataset: str | None = None
    bigquery_emulator_host: str | None = Field(
        default=None, validation_alias=AliasChoices("BIGQUERY_EMULATOR_HOST", "ONCEFLOW_BIGQUERY_EMULATOR_HOST")
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

    events_source: Literal["pubsub", "files"] = "pubsub"
    events_dir: str | None = None
    delivery: Literal["exactly_once", "at_least_once"] = "exactly_once"
    window_s: int = Field(default=60, ge=60)
    allowed_lateness_s: int = Field(default=30, ge=0)
    late_policy: Literal["drop", "refire"] = "drop"
    dedup_horizon_s: int = Field(default=24 * 3600, gt=0)
    dedup_fast_path: bool = Field(default=True, description="Bloom filters of committed IDs (DESIGN 4).")

    crash_at: str | None = Field(default=None, description="Fault injection: `<point>[#k]`.")
    dagster_home: str | None = Field(default=None, validation_alias=AliasChoices("DAGSTER_HOME"))

    @field_validator("crash_at")
    @classmethod
    def _known_point(cls, value: str | None) -> str | None:
        if value:
            point, _, nth = value.partition("#")
            if point not in POINTS or (nth and not nth.isdigit()):
                raise ValueError(f"unknown crash point {value!r} (points: {', '.join(sorted(POINTS))}; `#k` optional)")
        return value or None

    @property
    def home_path(self) -> str:
        """`home` as an absolute path (or the `gs://` URL as given)."""
        return self.home.rstrip("/") if "://" in self.home else str(Path(self.home).absolute())

    @property
    def events_directory(self) -> str:
        """Where the file-source variant of `events` reads: `ONCEFLOW_EVENTS_DIR`, else `<home>/incoming/events`."""
        return self.events_dir or f"{self.home_path}/incoming/events"


def load_settings() -> Settings:
    """Read and validate the settings from the process environment."""
    try:
        return Settings()
    except ValidationError as error:
        raise SettingsError("; ".join(_describe(e) for e in error.errors())) from None


def _describe(error: Mapping) -> str:
    loc = str(error["loc"][0]) if error.get("loc") else "?"
    variable = loc if loc.isupper() else f"{PREFIX}{loc.upper()}"
    return f"{variable}={error.get('input')!r}: {error['msg']}"
