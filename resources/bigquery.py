"""BigQuery for publishing: dagster-gcp's `BigQueryResource`, plus the dataset windows are published to and an
optional API endpoint (the local emulator).

Publishing to BigQuery is on when a dataset is set: `ONCEFLOW_BIGQUERY_DATASET`, in the project
`ONCEFLOW_BIGQUERY_PROJECT` (default: the one Application Default Credentials name). With `BIGQUERY_EMULATOR_HOST`
(`http://127.0.0.1:9050`) the client talks to that endpoint unauthenticated; otherwise credentials come from ADC
or the resource's `gcp_credentials`, never from the repository.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import dagster_gcp
from google.cloud import bigquery
from pydantic import Field


class BigQueryResource(dagster_gcp.BigQueryResource):
    """dagster-gcp's BigQuery resource with a publish `dataset` and an optional `api_endpoint`."""

    dataset: str | None = Field(default=None, description="Dataset windowed assets are published to; None: off.")
    api_endpoint: str | None = Field(default=None, description="BigQuery API endpoint, e.g. a local emulator.")

    @classmethod
    def from_env(cls) -> BigQueryResource:
        return cls(
            project=os.environ.get("ONCEFLOW_BIGQUERY_PROJECT") or None,
            dataset=os.environ.get("ONCEFLOW_BIGQUERY_DATASET") or None,
            api_endpoint=os.environ.get("BIGQUERY_EMULATOR_HOST") or None,
        )

    @property
    def enabled(self) -> bool:
        return self.dataset is not None

    @contextmanager
    def get_client(self) -> Iterator[bigquery.Client]:
        if self.api_endpoint is None:
            with super().get_client() as client:
                yield client
            return
        from google.auth.credentials import AnonymousCredentials

        # An emulator takes no credentials; a project must be named since there is no ADC to infer it from.
        client = bigquery.Client(
            project=self.project or "onceflow-local",
            location=self.location,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.api_endpoint},
        )
        try:
            yield client
        finally:
            client.close()

    def ensure_dataset(self) -> None:
        """Create the publish dataset if it does not exist (BigQuery loads need it)."""
        if self.dataset is None:
            return
        with self.get_client() as client:
            client.create_dataset(self.dataset, exists_ok=True)
