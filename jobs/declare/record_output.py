"""`RecordOutput`: every record a raw batch inserted, optionally transformed row-wise, to the sinks users have,
exactly once per batch (`onceflow.jobs.publish.record_sequence` publishes it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.jobs.declare.sink import Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RECORD_COLUMNS = ("record_id", "event_time")
"""Columns a record output's input has beside the schema's fields."""


@dataclass(frozen=True, kw_only=True)
class RecordOutput:
    """One Dagster asset whose every materialization is one raw batch published to each of `sinks`.

    The input of a publication is the records one raw batch inserted (the schema's fields, `record_id`,
    `event_time`), read at that batch's commit version; `transform`, when given, maps it row by row and must be
    deterministic (filter, project, enrich by a join with a static table): a batch published again publishes the
    same rows. Its identity is (pipeline, output, epoch, batch): each sink holds each batch once.
    """

    asset: str
    sinks: Sequence[Sink]
    transform: Callable[[DataFrame], DataFrame] | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sinks", (self.sinks,) if isinstance(self.sinks, Sink) else _tuple(self.sinks))

    def sink(self, name: str) -> Sink:
        """The sink called `name`; `KeyError` naming the declared ones when there is none."""
        for sink in self.sinks:
            if sink.name == name:
                return sink
        raise KeyError(f"{self.asset} has no sink {name!r} now (it has {', '.join(s.name for s in self.sinks)})")


def close_sinks(outputs: Iterable[RecordOutput]) -> None:
    """Let every sink of `outputs` go of its connections (a run's end)."""
    for output in outputs:
        for sink in output.sinks:
            sink.close()


def _tuple(value: Any) -> tuple:
    try:
        return tuple(value)
    except TypeError:
        return (value,)


def check_record_output(o: RecordOutput, where: str, fail: Callable[[str, str], None]) -> None:
    """Fail (`fail(field, problem)`) on the first mistake in a record output's declaration."""
    if not o.sinks:
        fail(f"{where}.sinks", "name at least one sink (PostgresSink, KafkaSink, FileSink, or a onceflow.Sink)")
    names = []
    for index, sink in enumerate(o.sinks):
        if not isinstance(sink, Sink):
            fail(f"{where}.sinks[{index}]", f"{type(sink).__name__} is not a record sink: use PostgresSink, "
                 "KafkaSink, FileSink, or a subclass of onceflow.Sink")
        for problem in sink.problems():
            fail(f"{where}.sinks[{index}]", problem)
        names.append(sink.name)
    for name in names:
        if names.count(name) > 1:
            fail(f"{where}.sinks", f"two sinks are called {name!r}: a sink's name identifies it in commits")
    if o.transform is not None and not callable(o.transform):
        fail(f"{where}.transform", f"{o.transform!r} is not a function of a DataFrame")
