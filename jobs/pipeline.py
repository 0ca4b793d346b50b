"""The declaration of a pipeline: where records come from, how they are identified, windowed and delivered.

A pipeline is declared once (`Pipeline`), and everything else — the ingest job, the window asset, the sensors,
the tables — is derived from the declaration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Delivery = Literal["exactly_once", "at_least_once"]
LatePolicy = Literal["drop", "refire"]


@dataclass(frozen=True)
class PubSubSourceSpec:
    """A Pub/Sub subscription (plus a metadata-only tracking subscription for the watermark).

    `id_attribute` names the attribute that carries the record ID (it survives publisher retries); without it, or
    on a message that lacks it, the Pub/Sub message id is the ID. `timestamp_attribute` carries the event time
    (RFC 3339 or epoch milliseconds); without it, or on a message that lacks it, the publish time is used.
    """

    topic: str
    subscription: str
    tracking_subscription: str
    id_attribute: str | None = None
    timestamp_attribute: str | None = None
    max_messages: int = 10_000
    max_seconds: float = 10.0
    ack_deadline_s: int = 60
    kind: Literal["pubsub"] = "pubsub"


@dataclass(frozen=True)
class FileSourceSpec:
    """A directory of `*.jsonl` files, one JSON object per line.

    `id_field` names the field with the record ID; without it (or when a line lacks it) the ID is
    `<relative path>:<byte offset>`. `timestamp_field` carries the event time (RFC 3339 or epoch milliseconds).
    """

    directory: str
    pattern: str = "*.jsonl"
    id_field: str | None = None
    timestamp_field: str = "event_time"
    max_files: int = 100
    max_bytes: int = 256 * 1024 * 1024
    out_of_orderness_s: float = 30.0
    kind: Literal["files"] = "files"


SourceSpec = PubSubSourceSpec | FileSourceSpec


@dataclass(frozen=True)
class Pipeline:
    """One pipeline: a source, its record contract, its windows and its delivery mode.

    `delivery="exactly_once"` deduplicates on record IDs within `dedup_horizon_s`; `"at_least_once"` appends every
    valid record (publisher retries and redeliveries stay as duplicates) and only skips replays of a whole batch.
    `watermark_band_s` / `watermark_idle_s` override `ONCEFLOW_WATERMARK_BAND_S` / `ONCEFLOW_WATERMARK_IDLE_S`.
    """

    name: str
    source: SourceSpec
    window_asset: str = ""
    window_s: int = 60
    allowed_lateness_s: int = 30
    late_policy: LatePolicy = "drop"
    delivery: Delivery = "exactly_once"
    dedup_horizon_s: int = 24 * 3600
    max_record_bytes: int = 64 * 1024
    watermark_band_s: float | None = None
    watermark_idle_s: float | None = None

    @property
    def source_id(self) -> str:
        """Names the source in checkpoints and is the Delta `txnAppId` of its commits."""
        return f"{self.name}/{self.source.kind}"

    def __post_init__(self) -> None:
        if not self.window_asset:
            object.__setattr__(self, "window_asset", f"{self.name}_counts")
        if self.window_s % 60 or 3600 % self.window_s:
            raise ValueError(f"window_s={self.window_s}: windows are whole minutes that divide an hour")

    @property
    def raw_table(self) -> str:
        return f"raw/{self.name}"

    @property
    def dead_letter_table(self) -> str:
        return f"dead_letter/{self.name}"

    @property
    def windows_table(self) -> str:
        return f"windows/{self.window_asset}"
