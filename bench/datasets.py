"""The data sets every contender ingests: what their records look like, how they are generated, and the onceflow
pipeline that declares them (the peer reads the same files with the same schema; see `bench.peer`).

- `clean`: the `events` pipeline's records (`key`, `value`) with epoch-millisecond times, plus publisher retries;
- `realistic` (`bench.realistic.REALISTIC`): a clickstream as producers write it: nested and optional fields,
  decimals and times as strings, malformed lines, retries, redeliveries of old records.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.declare.sources import FileSource
from onceflow.orchestration.pipelines import resolve
from onceflow.orchestration.pipelines.events import SCHEMA as EVENTS_SCHEMA
from onceflow.orchestration.workload import make_events, with_publisher_retries
from onceflow.resources.settings import load_settings

RETRY_FRACTION = 0.10


class BenchmarkError(RuntimeError):
    """A run produced the wrong table: its timing would be meaningless."""


@dataclass(frozen=True)
class Written:
    """What a generator wrote: lines, distinct valid records, and the malformed lines by onceflow's reason."""

    lines: int
    events: int
    dead_letters: dict[str, int] = field(default_factory=dict)
    detail: dict[str, int] = field(default_factory=dict)  # how the lines came about (retries, ...), for the report


@dataclass(frozen=True)
class Dataset:
    """A data set: its record schema (a pipeline's DDL), where a record's ID and event time are, and its generator
    (`generate(directory, events, files)`)."""

    name: str
    pipeline_name: str
    schema: str
    id_field: str
    time_field: str
    time_as_millis: bool  # the files hold epoch milliseconds (else ISO-8601 strings)
    default_events: int
    generate: Callable[[Path, int, int], Written]
    description: str
    declared: dict[str, str] = field(default_factory=dict)  # the pipeline's further settings, as its user sets them

    @property
    def fields(self) -> list[str]:
        return parse_schema(self.schema).names

    @property
    def reader_schema(self) -> str:
        """The schema a Spark user gives Spark's JSON reader: the ID, the event time, the record schema."""
        return f"{self.id_field} STRING, {self.time_field} {'BIGINT' if self.time_as_millis else 'TIMESTAMP'}, " + (
            self.schema
        )

    def pipeline(self, directory: Path, mode: str, files_per_batch: int) -> Pipeline:
        source = FileSource(directory=str(directory), id_field=self.id_field, timestamp_field=self.time_field,
                            max_files=files_per_batch)
        return resolve(Pipeline(name=self.pipeline_name, source=source, schema=self.schema, delivery=mode,
                                **self.declared), load_settings())


@dataclass(frozen=True)
class Source:
    """The JSON-lines directory every contender reads, and what it holds."""

    dataset: Dataset
    directory: Path
    files_per_batch: int
    records: int  # non-empty lines
    events: int  # distinct valid records
    dead_letters: dict[str, int]  # malformed lines by the reason onceflow dead-letters them for
    detail: dict[str, int]

    @classmethod
    def write(cls, dataset: Dataset, directory: Path, events: int, files: int, files_per_batch: int) -> Source:
        written = dataset.generate(directory, events, files)
        lines = sum(1 for path in directory.glob("*.jsonl") for line in path.read_text().splitlines() if line.strip())
        if lines != written.lines:
            raise BenchmarkError(f"{dataset.name}: {lines} lines written, the generator says {written.lines}")
        return cls(dataset, directory, files_per_batch, lines, written.events, written.dead_letters, written.detail)

    @property
    def malformed(self) -> int:
        return sum(self.dead_letters.values())


START_MS = 1_763_720_000_000
SPAN_MS = 6 * 3600 * 1000  # six hours of event time: a handful of hourly time buckets, all inside the horizon


def write_in_order(directory: Path, keyed: list[tuple[float, str]], files: int) -> None:
    """Lines by their key (where in the stream each falls), as `files` JSON-lines files of equal length."""
    keyed.sort(key=lambda pair: pair[0])
    per_file = math.ceil(len(keyed) / files)
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        chunk = keyed[n * per_file : (n + 1) * per_file]
        (directory / f"part-{n:03d}.jsonl").write_text("".join(f"{line}\n" for _, line in chunk))


def write_events(directory: Path, events: int, files: int, seed: int = 7) -> Written:
    """The `events` records plus publisher retries, shuffled, as `files` JSON-lines files."""
    stream = with_publisher_retries(make_events(events, START_MS, SPAN_MS, seed=seed), RETRY_FRACTION)
    per_file = math.ceil(len(stream) / files)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        chunk = stream[i * per_file : (i + 1) * per_file]
        (directory / f"part-{i:03d}.jsonl").write_text("".join(f"{e.json_line()}\n" for e in chunk))
    return Written(len(stream), events, detail={"retries": len(stream) - events})


CLEAN = Dataset(
    name="clean", pipeline_name="events", schema=EVENTS_SCHEMA, id_field="event_id", time_field="event_time",
    time_as_millis=True, default_events=300_000, generate=write_events,
    description="events {key, value} with epoch-millisecond times + 10% publisher retries",
)
