"""A commit step: one side effect of a commit sequence, with a read-only `verify` and an idempotent `execute`.

See `onceflow.jobs.publish.sequence` for the sequences that run them, and for the step kinds: `FileFinalize`, `HighWatermark`
there, `BigQueryLoad` in `onceflow.jobs.publish.bigquery_load`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict, TypeAdapter

from onceflow.jobs.declare.record_output import RecordOutput
from onceflow.jobs.declare.sink import Sink
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.resources.object_store import ObjectStore, open_store

if TYPE_CHECKING:
    from google.cloud import bigquery

BigQueryClients = Callable[[str], AbstractContextManager["bigquery.Client"]]
"""Given a project, a context manager yielding a BigQuery client: `BigQueryResource.get_client` fits
(`lambda project: resource.get_client()`), and so does a function returning a `bigquery.Client`."""

@dataclass(frozen=True)
class CommitContext:
    """What steps need at run time, as opposed to what they are (their parameters, stored in the sequence).

    `store` is the commit store (where `HighWatermark` records and `run_sequence` keeps progress); `bigquery`
    opens BigQuery clients for `BigQueryLoad` (None: sequences with such a step fail with a clear error);
    `bigquery_timeout_s` bounds the wait for one BigQuery job. `sinks` maps a file sink root, as named in the
    steps, to its open `ObjectStore`; a root not in it is opened with `open_store` on first use. `records` are the
    code location's record outputs, by asset: where a `RecordWrite` step finds its sink.
    """

    store: CommitStore
    bigquery: BigQueryClients | None = None
    bigquery_timeout_s: float = 600.0
    sinks: dict[str, ObjectStore] = field(default_factory=dict, compare=False, repr=False)
    records: Mapping[str, RecordOutput] = field(default_factory=dict, compare=False, repr=False)

    def bigquery_client(self, project: str) -> AbstractContextManager[bigquery.Client]:
        if self.bigquery is None:
            raise RuntimeError("this commit sequence loads BigQuery, but no BigQuery client was configured")
        return self.bigquery(project)

    def record_sink(self, asset: str, name: str) -> Sink:
        """The sink `name` of record output `asset`, as the code location declares it now; `KeyError` naming what is
        declared when the declaration no longer has it (the step then fails, rather than write elsewhere)."""
        if asset not in self.records:
            raise KeyError(f"no record output {asset!r} is declared in this code location")
        return self.records[asset].sink(name)

    def sink(self, root: str) -> ObjectStore:
        """The file sink rooted at `root` (a directory or `gs://` URL), opened once per context."""
        if root not in self.sinks:
            self.sinks[root] = open_store(root)
        return self.sinks[root]


class CommitStep(ABC):
    """One side effect of a commit sequence.

    Subclasses are frozen dataclasses whose fields are the step's parameters (JSON values; lists are read back as
    tuples), and have a unique `kind`. Contract:

    - `verify(ctx)` is True exactly when the effect is fully in place; it changes nothing.
    - `execute(ctx)` brings the effect about starting from any state an earlier, interrupted `execute` (or none)
      left, and tolerates another runner executing the same step at the same time. It may return without error
      and still leave `verify()` False (e.g. when the effect cannot be produced any more); the runner checks.
    """

    kind: ClassVar[str]
    # A stored step's parameters are checked against its fields (`from_params`); one it does not have is an error.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    @abstractmethod
    def verify(self, ctx: CommitContext) -> bool: ...

    @abstractmethod
    def execute(self, ctx: CommitContext) -> None: ...

    def describe(self) -> str:
        """A one-line description for errors and logs."""
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        """The step as stored in its sequence: `{"kind": ..., <parameter>: <value>, ...}`."""
        params = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        return {"kind": self.kind, **json.loads(json.dumps(params))}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CommitStep:
        """The step of this kind with `params` as `to_dict` stored them, validated against the step's field types
        (lists read back as tuples); pydantic's `ValidationError` (a `ValueError`) when they do not fit."""
        return _params_of(cls).validate_python(dict(params))


@functools.cache
def _params_of(kind: type[CommitStep]) -> TypeAdapter[CommitStep]:
    return TypeAdapter(kind)



def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
