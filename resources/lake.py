"""Where onceflow keeps its state: `$ONCEFLOW_HOME` (default `./.onceflow`), on local disk or `gs://`.

Under it: `lake/` holds the Delta tables, `landing/` the immutable batch files, `checkpoints/` the source
checkpoints, `manifests/` what each batch landed, `commits/` the commit sequences, `published/` the file sink and `staging/` files BigQuery loads read.
"""

from __future__ import annotations

import re

import dagster as dg

from onceflow.resources.object_store import ObjectStore, open_store

_NAME = re.compile(r"^[a-z][a-z0-9_]*(/[a-z][a-z0-9_]*)*$")


def checked_name(name: str) -> str:
    """Table and source names come from pipeline declarations; refuse anything that could escape the root."""
    if not _NAME.match(name):
        raise ValueError(f"invalid name {name!r}: lowercase letters, digits, '_' and '/' separators only")
    return name


class LakeResource(dg.ConfigurableResource):
    """Resolves Delta table paths and the landing area under one root."""

    home: str
    id_filters: bool = True
    """The dedup fast path (`onceflow.jobs.dedup.id_filters`): fingerprints of committed IDs under `<home>/filters`. Off, every
    batch looks its IDs up in the whole dedup horizon of the raw table."""

    def table_path(self, name: str) -> str:
        """The Delta table `name` (for example `raw/events`) under `<home>/lake`."""
        return f"{self.home}/lake/{checked_name(name)}"

    def landing(self) -> ObjectStore:
        return open_store(f"{self.home}/landing")

    def checkpoints(self) -> ObjectStore:
        return open_store(f"{self.home}/checkpoints")

    def commits(self) -> ObjectStore:
        return open_store(f"{self.home}/commits")

    def manifests(self) -> ObjectStore:
        """What each committed batch landed (its records' IDs and event times), for reconciliation: `<home>/manifests`."""
        return open_store(f"{self.home}/manifests")

    def epochs(self) -> ObjectStore:
        """Pipelines' epochs (`onceflow reset`), apart from the checkpoints: `<home>/epochs`."""
        return open_store(f"{self.home}/epochs")

    def panes(self) -> ObjectStore:
        """Window pane closes, apart from the checkpoints (restoring an old checkpoint must not reopen a closed
        window): `<home>/panes`."""
        return open_store(f"{self.home}/panes")

    def sink_root(self) -> str:
        """Where the file sink publishes: `<home>/published`."""
        return f"{self.home}/published"

    def staging_root(self) -> str:
        """Where a BigQuery-only output stages the pane files its loads read: `<home>/staging`."""
        return f"{self.home}/staging"

    def filters(self) -> ObjectStore:
        """The dedup fast path's ID filters, derived from the raw tables: `<home>/filters`."""
        return open_store(f"{self.home}/filters")

    def declarations(self) -> ObjectStore:
        """Verdicts of load-time transform checks, by fingerprint: `<home>/declarations`."""
        return open_store(f"{self.home}/declarations")
