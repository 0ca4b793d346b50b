"""`KafkaSink`: a record output's rows as Kafka records, each commit in one transaction with its marker
(`onceflow.resources.kafka_writer`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.jobs.declare.sink import Commit, Sink, record_json

if TYPE_CHECKING:
    import pyarrow as pa

    from onceflow.resources.kafka_writer import TransactionalWriter

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,240}$")
_OWNED = frozenset({"bootstrap.servers", "transactional.id", "enable.idempotence", "isolation.level"})


@dataclass(frozen=True, kw_only=True)
class KafkaSink(Sink):
    """The topic `topic` on the cluster at `bootstrap_servers`: one record per row, its value the row as a JSON
    object, its key the column `key` (none without it), a `record_id` header on each record the output gives a
    `record_id`. Each commit is one transaction, with a marker record on `markers_topic` (default
    `<topic>.onceflow-commits`); consumers read with `isolation.level=read_committed`. `options` are producer
    settings (security and such; a secret as `dg.EnvVar("NAME")`); topics missing are created.
    """

    bootstrap_servers: str | Sequence[str]
    topic: str
    key: str | None = None
    markers_topic: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)
    _writers: dict[str, TransactionalWriter] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"kafka:{self.topic}"

    @property
    def markers(self) -> str:
        return self.markers_topic or f"{self.topic}.onceflow-commits"

    def write(self, rows: pa.Table, commit: Commit) -> None:
        records = [(None if self.key is None or row[self.key] is None else str(row[self.key]).encode(),
                    record_json(row).encode(), None if row.get("record_id") is None else str(row["record_id"]))
                   for row in rows.to_pylist()]
        marker = {"pipeline": commit.pipeline, "output": commit.output, "epoch": commit.epoch,
                  "batch": commit.batch, "rows": rows.num_rows}
        self._writer(commit).write(records, commit.id, marker)

    def committed(self, commit: Commit) -> bool:
        return self._writer(commit).committed(commit.id)

    def rows(self, commit: Commit) -> int | None:
        return self._writer(commit).rows_of(commit.id)

    def problems(self) -> list[str]:
        found = [f"{name} {value!r} is not a Kafka topic name" for name, value in
                 (("topic", self.topic), ("markers_topic", self.markers_topic))
                 if value is not None and (not isinstance(value, str) or not _TOPIC.match(value))]
        found += [f"options: {name!r} is onceflow's to set" for name in self.options if name in _OWNED]
        if not self.bootstrap_servers:
            found.append("bootstrap_servers: name at least one broker")
        return found

    def _writer(self, commit: Commit) -> TransactionalWriter:
        # One transactional id per output and topic: a second writer of the output fences the first.
        transactional_id = f"onceflow.{commit.pipeline}.{commit.output}.{self.topic}"
        writer = self._writers.get(transactional_id)
        if writer is None:
            from onceflow.resources.kafka_writer import TransactionalWriter

            servers = self.bootstrap_servers
            options = {k: str(v.get_value() if hasattr(v, "get_value") else v) for k, v in self.options.items()}
            writer = TransactionalWriter(servers if isinstance(servers, str) else ",".join(servers), self.topic,
                                         self.markers, transactional_id, options)
            self._writers[transactional_id] = writer
        return writer
