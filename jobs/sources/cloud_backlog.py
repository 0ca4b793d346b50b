"""The base subscription's backlog on GCP, read from Cloud Monitoring (see `onceflow.jobs.sources.backlog`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Self

from google.api_core.exceptions import GoogleAPIError, PermissionDenied
from google.auth.exceptions import DefaultCredentialsError

from onceflow.jobs.sources.backlog import BacklogUnknown, ReadsBacklogElsewhere, check_state_kind

log = logging.getLogger("onceflow")
_UNKNOWN = "the Pub/Sub backlog is unknown, so the watermark holds: "


class CloudMonitoringBacklogProbe(ReadsBacklogElsewhere):
    """The base subscription's backlog on GCP, from Cloud Monitoring's
    `pubsub.googleapis.com/subscription/oldest_unacked_message_age` (seconds, sampled every 60 s).

    The oldest unacked publish time is the newest sample's time minus its age; an age of 0 means no backlog. The
    metric arrives minutes late, so the answer can be that old: a backlog that cleared since looks older (the
    watermark waits), one that appeared since is not seen yet (the tracking range still bounds the watermark).
    When the query returns no sample, or cannot be made (no credentials, no permission, the API unreachable), the
    backlog is unknown (`BacklogUnknown`), never "no backlog": the watermark then stays where it is. A query that
    cannot be made is reported as one error line on the `onceflow` logger naming the fix, not a traceback.

    Needs `google-cloud-monitoring` (the `gcp` extra) and, for the pipeline's identity, `roles/monitoring.viewer`
    on the project. A `client` (a `monitoring_v3.MetricServiceClient` or anything with its `list_time_series`)
    replaces the one made from Application Default Credentials. The probe keeps no state worth persisting:
    what the pipeline saw and committed changes nothing and `to_state` is just its kind.
    """

    METRIC = "pubsub.googleapis.com/subscription/oldest_unacked_message_age"

    def __init__(
        self, project: str, subscription: str, *, lookback_ms: int = 600_000, client: Any = None
    ) -> None:
        self.project = project
        self.subscription = subscription
        self.lookback_ms = lookback_ms
        self._client = client

    def query_filter(self) -> str:
        """The Cloud Monitoring filter selecting this subscription's metric."""
        return (
            f'metric.type = "{self.METRIC}" AND resource.type = "pubsub_subscription" '
            f'AND resource.labels.subscription_id = "{self.subscription}"'
        )

    def oldest_unacked_ms(self, now_ms: int) -> int | None:
        """Query the metric over `[now_ms - lookback_ms, now_ms]` and return the newest sample's reading; raises
        `BacklogUnknown` when there is no sample or the query cannot be made."""
        try:
            series = self._query(now_ms)
        except BacklogUnknown as unknown:
            log.error("%s", unknown)
            raise
        newest: tuple[int, int] | None = None
        for one in series:
            for point in one.points:
                at_ms = round(point.interval.end_time.timestamp() * 1000)
                if newest is None or at_ms > newest[0]:
                    newest = (at_ms, int(point.value.int64_value))
        if newest is None:
            raise BacklogUnknown(f"Cloud Monitoring has no {self.METRIC} sample for {self.subscription} in the "
                                 f"last {self.lookback_ms // 1000} s")
        at_ms, age_s = newest
        return None if age_s <= 0 else at_ms - age_s * 1000

    def _query(self, now_ms: int) -> list[Any]:
        role = f"roles/monitoring.viewer on project {self.project}"
        try:
            if self._client is None:
                from google.cloud import monitoring_v3  # the `gcp` extra: only needed on GCP

                self._client = monitoring_v3.MetricServiceClient()
            start_ms = now_ms - self.lookback_ms
            return list(self._client.list_time_series(  # every page, within the errors handled below
                request={
                    "name": f"projects/{self.project}",
                    "filter": self.query_filter(),
                    "interval": {
                        "start_time": {"seconds": start_ms // 1000, "nanos": start_ms % 1000 * 1_000_000},
                        "end_time": {"seconds": now_ms // 1000, "nanos": now_ms % 1000 * 1_000_000},
                    },
                }
            ))
        except ImportError:
            raise BacklogUnknown(
                _UNKNOWN + "google-cloud-monitoring is not installed: pip install 'onceflow[gcp]'"
            ) from None
        except DefaultCredentialsError:
            raise BacklogUnknown(
                _UNKNOWN + "no Google credentials: run `gcloud auth application-default login`, set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run as a service account; it "
                f"needs {role}"
            ) from None
        except PermissionDenied:
            raise BacklogUnknown(_UNKNOWN + f"permission denied: grant the pipeline's identity {role}") from None
        except GoogleAPIError as error:
            raise BacklogUnknown(_UNKNOWN + f"Cloud Monitoring failed: {error}") from None

    def to_state(self) -> dict[str, Any]:
        return {"kind": "cloud_monitoring_backlog"}

    def from_state(self, state: Mapping[str, Any]) -> Self:
        if state:
            check_state_kind(state, "cloud_monitoring_backlog")
        return self
