"""BigQuery for publishing: dagster-gcp's `BigQueryResource`, plus the dataset windows are published to and an
optional API endpoint (the local emulator).

Which tables a pipeline publishes to is its declaration's (`BigQuerySink`); this resource is the connection: the
project (`ONCEFLOW_BIGQUERY_PROJECT`, default: the one Application Default Credentials name) and, with
`BIGQUERY_EMULATOR_HOST` (`http://127.0.0.1:9050`), an emulator endpoint talked to unauthenticated; otherwise
credentials come from ADC or the resource's `gcp_credentials`, never from the repository.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster_gcp
from google.cloud import bigquery
from pydantic import Field


class BigQueryResource(dagster_gcp.BigQueryResource):
    """dagster-gcp's BigQuery resource with an optional `api_endpoint`."""

    api_endpoint: str | None = Field(default=None, description="BigQuery API endpoint, e.g. a local emulator.")

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

    def ensure_dataset(self, dataset: str, project: str | None = None) -> str:
        """Create `dataset` if it does not exist (BigQuery loads need it); returns its project."""
        with self.get_client() as client:
            project = project or client.project
            client.create_dataset(f"{project}.{dataset}", exists_ok=True)
        return project
