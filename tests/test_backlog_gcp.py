"""The Cloud Monitoring backlog probe as it behaves on GCP, short of a real project: its dependency comes with the
`gcp` extra, a missing sample is an unknown backlog (the watermark holds) and a missing credential is one clear
error line per query naming the fix. The credential test runs Google's real client with no credentials at all."""

from __future__ import annotations

import logging
import re
from importlib.metadata import requires
from pathlib import Path
from typing import Any

import pytest

from onceflow.jobs.sources.backlog import BacklogUnknown
from onceflow.jobs.sources.cloud_backlog import CloudMonitoringBacklogProbe
from onceflow.jobs.sources.tracking import TrackingSample
from onceflow.jobs.sources.watermark import PubSubWatermark

T0 = 1_763_720_000_000
BAND = 10_000


class NoSamples:
    """Cloud Monitoring's answer when the metric has no point in the interval (it arrives minutes late)."""

    def list_time_series(self, request: dict[str, Any]) -> list[Any]:
        return []


def fed(watermark: PubSubWatermark) -> PubSubWatermark:
    """The tracking subscription has seen one message, published at T0 with event time T0 - 1 s."""
    watermark.observe([TrackingSample("m1", T0, T0 - 1_000)], T0 + 1_000)
    watermark.committed([("m1", T0)])
    return watermark


def test_the_gcp_extra_installs_cloud_monitoring() -> None:
    extras = [r for r in requires("onceflow") or [] if r.startswith("google-cloud-monitoring")]
    assert extras and all('extra == "gcp"' in r for r in extras), extras
    from google.cloud import monitoring_v3

    assert hasattr(monitoring_v3, "MetricServiceClient")


def test_a_missing_sample_is_unknown_and_the_watermark_holds() -> None:
    probe = CloudMonitoringBacklogProbe("proj", "sub", client=NoSamples())
    with pytest.raises(BacklogUnknown, match=re.escape(f"no {CloudMonitoringBacklogProbe.METRIC} sample for sub")):
        probe.oldest_unacked_ms(T0)
    watermark = fed(PubSubWatermark(probe, band_ms=BAND))
    # "No backlog" would put the watermark at T - band = T0 - 9 s, and the idle rule later at now - band.
    assert watermark.current(T0 + 2_000) is None
    assert watermark.current(T0 + 3_600_000) is None
    assert watermark.to_state()["watermark_ms"] is None


def test_a_missing_credential_is_one_clear_error_per_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud ADC file here
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # not on GCE: no metadata server to ask
    watermark = fed(PubSubWatermark(CloudMonitoringBacklogProbe("proj", "sub"), band_ms=BAND))
    with caplog.at_level(logging.ERROR, logger="onceflow"):
        assert watermark.current(T0 + 2_000) is None
        assert watermark.current(T0 + 3_600_000) is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2, [r.getMessage() for r in errors]
    for record in errors:
        message = record.getMessage()
        assert record.name == "onceflow" and record.exc_info is None  # a line, not a traceback
        assert "the Pub/Sub backlog is unknown, so the watermark holds: no Google credentials" in message
        assert "gcloud auth application-default login" in message and "GOOGLE_APPLICATION_CREDENTIALS" in message
        assert "roles/monitoring.viewer on project proj" in message
