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
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

if TYPE_CHECKING:
    from google.cloud import bigquery


class BigQueryResource(dg.ConfigurableResource):
    """dagster-gcp's BigQuery resource (the same settings, the client made by it), plus an optional `api_endpoint`.

    dagster-gcp and google-cloud-bigquery are imported when a client is first asked for: importing them takes
    seconds, which every run process (a micro-batch's among them) would otherwise pay before its first batch.
    """

    project: str | None = Field(default=None, description="Project the client acts for (default: ADC's).")
    location: str | None = Field(default=None, description="Default location for jobs, datasets and tables.")
    gcp_credentials: str | None = Field(
        default=None, description="A service-account key, base64-encoded (dagster-gcp's `gcp_credentials`)."
    )
    api_endpoint: str | None = Field(default=None, description="BigQuery API endpoint, e.g. a local emulator.")

    @contextmanager
    def get_client(self) -> Iterator[bigquery.Client]:
        if self.api_endpoint is None:
            import dagster_gcp

            connection = dagster_gcp.BigQueryResource(
                project=self.project, location=self.location, gcp_credentials=self.gcp_credentials
            )
            with connection.get_client() as client:
                yield client
            return
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import bigquery

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
