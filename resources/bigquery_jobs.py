"""BigQuery tables and jobs made idempotent: tables created and evolved by concurrent writers, and jobs run under
deterministic ids, so a retried or concurrent submission has the effect of one.

A job's id is `<stem>_g<generation>`: a job id that exists already (409 Conflict) means an earlier attempt or a
concurrent runner submitted that job, whose result is then waited for and used. Only when that job failed (a
failed job changes nothing) or its result is gone is the next generation's id used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.cloud import bigquery

MAX_GENERATIONS = 100


class BigQueryTypeChanged(RuntimeError):
    """A BigQuery table holds a column under another type than the output now gives it."""


def run_job(
    client: bigquery.Client,
    project: str,
    kind: str,
    job_id: Callable[[int], str],
    submit: Callable[[str], Any],
    timeout_s: float,
    result_usable: Callable[[], bool] = lambda: True,
) -> Any:
    """Run the `kind` job (`load`, `merge`...) `submit(job_id(generation))` once in effect (see the module docstring); returns the job that
    succeeded (submitted now, or found). `result_usable` says whether a job found done still serves (False: its
    result is gone, and the next generation runs)."""
    from google.api_core.exceptions import GoogleAPICallError, NotFound

    for generation in range(MAX_GENERATIONS):
        current_id = job_id(generation)
        try:
            submitted = submit(current_id)
            found = None
        except GoogleAPICallError as error:
            # 409 from BigQuery; a racing duplicate may also get 400 from the emulator. Whatever the
            # answer, if a job with this id exists it was submitted before, and its result is what counts.
            try:
                found = client.get_job(current_id, project=project, location=client.location)
            except NotFound:
                raise error from None
            submitted = None
        current = submitted or found
        wait_done(current, timeout_s)
        if current.error_result is None:
            if submitted is not None or result_usable():
                return current
            continue  # an earlier attempt's result is gone: redo the job under the next generation
        if submitted is not None:
            raise RuntimeError(f"BigQuery {kind} job {current_id} failed: {current.error_result}")
        # An earlier attempt's job failed, changing nothing: its id is spent, the next generation runs.
    raise RuntimeError(f"BigQuery {kind} jobs {job_id(0)} and on failed {MAX_GENERATIONS} times")


def succeeded_job(client: bigquery.Client, project: str, job_id: Callable[[int], str]) -> Any | None:
    """The job of `job_id`'s generations that is done without error, read-only; None when there is none (yet:
    one still running is not done)."""
    from google.api_core.exceptions import NotFound

    for generation in range(MAX_GENERATIONS):
        try:
            job = client.get_job(job_id(generation), project=project, location=client.location)
        except NotFound:
            return None  # generations are used in order: none after the first missing one
        if job.state != "DONE":
            return None
        if job.error_result is None:
            return job
    return None


def create_table(client: bigquery.Client, table_id: str, schema: list[bigquery.SchemaField]) -> None:
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud import bigquery

    try:
        client.create_table(bigquery.Table(table_id, schema=schema), exists_ok=True)
    except GoogleAPICallError as error:
        # A concurrent creator can make this call fail otherwise than with 409 (the emulator answers 400 when
        # two catalogue commits collide); what matters is that the table exists.
        if not table_exists(client, table_id):
            raise error from None


def evolve_table(client: bigquery.Client, table_id: str, schema: list[bigquery.SchemaField]) -> None:
    """Add to the table the columns of `schema` it lacks, NULLABLE (rows loaded before hold NULL there), as the
    Delta tables evolve; a column it holds under another type is `BigQueryTypeChanged`, naming it and the way out."""
    table = client.get_table(table_id)
    held = {field.name.lower(): field for field in table.schema}
    for field in schema:
        found = held.get(field.name.lower())
        if found is not None and _kind(found) != _kind(field):
            raise BigQueryTypeChanged(
                f"BigQuery table {table_id}: column {field.name!r} is {_kind(found)}, the output now gives "
                f"{_kind(field)}; BigQuery cannot change it in place: publish the output to a new table (or "
                "drop this one), or give the column its old type in the transform"
            )
    added = [field for field in schema if field.name.lower() not in held]
    if added:
        from google.cloud import bigquery

        table.schema = [*table.schema, *(bigquery.SchemaField(f.name, f.field_type, mode="NULLABLE",
                                                              fields=f.fields) for f in added)]
        client.update_table(table, ["schema"])


_STANDARD = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL", "RECORD": "STRUCT"}


def _kind(field: bigquery.SchemaField) -> str:
    """A field's type by its standard SQL name (the API answers with legacy ones), and its mode if repeated."""
    kind = _STANDARD.get(field.field_type, field.field_type)
    return f"ARRAY<{kind}>" if field.mode == "REPEATED" else kind


def drop_table(client: bigquery.Client, table_id: str) -> None:
    from google.api_core.exceptions import GoogleAPICallError

    try:
        client.delete_table(table_id, not_found_ok=True)
    except GoogleAPICallError as error:
        if table_exists(client, table_id):  # as in `create_table`: a concurrent runner may have dropped it
            raise error from None


def table_exists(client: bigquery.Client, table_id: str) -> bool:
    from google.api_core.exceptions import NotFound

    try:
        client.get_table(table_id)
    except NotFound:
        return False
    return True


def wait_done(job: Any, timeout_s: float) -> None:
    """Wait until `job` is DONE, however it ended: a failed job is an answer here (its `error_result` says how),
    not an exception."""
    from google.api_core.exceptions import GoogleAPICallError

    deadline = time.monotonic() + timeout_s
    try:
        job.result(timeout=timeout_s)
    except GoogleAPICallError:
        # The error may come from the results call (jobs.getQueryResults) of a query that failed, before the
        # job's own status was read: its `error_result` is only an answer once jobs.get says DONE.
        while job.state != "DONE" and time.monotonic() < deadline:
            job.reload()
            if job.state != "DONE":
                time.sleep(0.1)
    except TimeoutError:
        pass
    if job.state != "DONE":
        raise TimeoutError(f"BigQuery job {job.job_id} not done after {timeout_s:.0f}s (state {job.state})")
