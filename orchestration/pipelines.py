"""The pipelines onceflow runs, declared once; settings come from `ONCEFLOW_*` variables and defaults.

The reference pipeline `events` reads Pub/Sub topic `onceflow-events` (or, with `ONCEFLOW_EVENTS_SOURCE=files`,
the `*.jsonl` files in `ONCEFLOW_EVENTS_DIR`).
"""

from __future__ import annotations

import os

from jobs.pipeline import FileSourceSpec, Pipeline, PubSubSourceSpec, SourceSpec


def _env(name: str, default: str) -> str:
    return os.environ.get(f"ONCEFLOW_{name}", default)


def events_source() -> SourceSpec:
    if _env("EVENTS_SOURCE", "pubsub") == "files":
        return FileSourceSpec(
            directory=_env("EVENTS_DIR", os.path.join(_env("HOME", ".onceflow"), "incoming", "events")),
            id_field="event_id",
            timestamp_field="event_time",
            max_files=int(_env("MAX_FILES", "100")),
        )
    return PubSubSourceSpec(
        topic="onceflow-events",
        subscription="onceflow-events-sub",
        tracking_subscription="onceflow-events-tracking",
        id_attribute="event_id",
        timestamp_attribute="event_time",
        max_messages=int(_env("MAX_MESSAGES", "10000")),
        max_seconds=float(_env("MAX_SECONDS", "10")),
        ack_deadline_s=int(_env("ACK_DEADLINE_S", "60")),
    )


def events_pipeline() -> Pipeline:
    return Pipeline(
        name="events",
        source=events_source(),
        window_asset="event_counts",
        window_s=int(_env("WINDOW_S", "60")),
        allowed_lateness_s=int(_env("ALLOWED_LATENESS_S", "30")),
        late_policy=_env("LATE_POLICY", "drop"),  # type: ignore[arg-type]
        delivery=_env("DELIVERY", "exactly_once"),  # type: ignore[arg-type]
        dedup_horizon_s=int(_env("DEDUP_HORIZON_S", str(24 * 3600))),
    )


PIPELINES: list[Pipeline] = [events_pipeline()]
