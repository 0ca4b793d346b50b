"""`onceflow verify`: the reconciliation (`onceflow.jobs.verify.reconcile`) of each pipeline, with Spark, and a
verdict of its own per pipeline. Exit 0 when exactly-once held, 1 on a mismatch, 2 on an error named on stderr:
never a traceback for what the tables or the sources hold. `--json` prints one document instead of the text,
`--pipeline` limits it to the pipelines named."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sinks import files_root
from onceflow.jobs.sources.checkpoint import EpochStore
from onceflow.jobs.sources.reader import open_source
from onceflow.jobs.verify.landed import landed_records
from onceflow.jobs.verify.reconcile import (
    SourceReconciliation,
    WindowReconciliation,
    reconcile,
    reconcile_source,
    render,
)
from onceflow.jobs.verify.record_outputs import RecordReconciliation, reconcile_records
from onceflow.jobs.windows.panes import CloseStore
from onceflow.orchestration.deployments import LAKE, SPARK, resources_for
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SAMPLE = 10  # IDs named per problem; the count is always whole


class UnknownPipeline(ValueError):
    """`--pipeline` names a pipeline the code location does not declare."""


def selected(pipelines: list[Pipeline], names: list[str] | None) -> list[Pipeline]:
    """The pipelines `names` (every one when None), in declaration order; an unknown name is `UnknownPipeline`."""
    if not names:
        return pipelines
    known = {p.name for p in pipelines}
    unknown = sorted(set(names) - known)
    if unknown:
        raise UnknownPipeline(f"no pipeline {', '.join(map(repr, unknown))}: the pipelines are "
                              f"{', '.join(sorted(known)) or 'none'}")
    return [p for p in pipelines if p.name in names]


def reconcile_pipeline(
    spark: SparkSession, pipeline: Pipeline, lake: LakeResource
) -> tuple[SourceReconciliation, dict[str, list[WindowReconciliation]]]:
    """The reconciliation of a pipeline: its source's, and every output's per window."""
    source = open_source(pipeline, lake)  # landed batches only: the source itself is not read
    epochs = range(EpochStore(lake.epochs()).current(pipeline.name))
    landed = landed_records(*(open_source(pipeline, lake, epoch=e) for e in epochs), source)
    commits = CommitStore(lake.commits())
    outputs = {
        output.asset: reconcile(
            spark, source, output, CloseStore(lake.panes(), output.asset), commits, lake.table_path(output.table),
            files_root(output, lake.sink_root(), lake.staging_root()), landed.records,
        )
        for output in pipeline.windowed_outputs
    }
    return reconcile_source(source, landed), outputs


def reconcile_record_outputs(pipeline: Pipeline, lake: LakeResource) -> list[RecordReconciliation]:
    """Each record output's account of the batches it published and the sinks that hold them."""
    source, commits = open_source(pipeline, lake), CommitStore(lake.commits())
    return [reconcile_records(source, output, commits) for output in pipeline.record_outputs]


def _problems(source: SourceReconciliation) -> list[tuple[str, str, list[str]]]:
    """(JSON key, what the text says, the IDs) of each way a record can break exactly-once."""
    return [("lost", "lost (landed, held nowhere)", source.lost), ("doubled_raw", "twice in raw", source.doubled_raw),
            ("doubled_dead_letters", "twice in the dead letters", source.doubled_dead)]


def pipeline_document(
    name: str, source: SourceReconciliation, outputs: dict[str, list[WindowReconciliation]],
    records: Sequence[RecordReconciliation] = (),
) -> dict[str, Any]:
    """One pipeline's verdict as JSON: each problem's count and first IDs, every window's account, every record
    output's."""
    problems = {key: {"count": len(ids), "ids": ids[:SAMPLE]} for key, _, ids in _problems(source)}
    windows = {asset: [{**dataclasses.asdict(r), "ok": r.ok} for r in rows] for asset, rows in outputs.items()}
    holds = source.ok and all(r.ok for rows in outputs.values() for r in rows) and all(r.ok for r in records)
    return {"pipeline": name, "holds": holds, **problems, "metric_mismatches": source.metric_mismatches,
            "notes": source.notes, "outputs": windows,
            "record_outputs": {r.asset: {**dataclasses.asdict(r), "ok": r.ok} for r in records}}


def print_pipeline(
    name: str, source: SourceReconciliation, outputs: dict[str, list[WindowReconciliation]],
    records: Sequence[RecordReconciliation] = (),
) -> bool:
    """Print one pipeline's reconciliation and its verdict; True when exactly-once held for it."""
    for _, problem, ids in _problems(source):
        if ids:
            print(f"{name}: {len(ids)} record IDs {problem}: {', '.join(ids[:SAMPLE])}")
    for line in [*source.metric_mismatches, *source.notes]:
        print(f"{name}: {line}")
    held = source.ok
    for asset, rows in outputs.items():
        print(f"{name} {asset}: received = inserted + duplicates + late + dead-lettered, per window")
        print(render(rows))
        bad = [r.window for r in rows if not r.ok]
        held = held and not bad
        print(f"{name} {asset}: {'MISMATCH in ' + ', '.join(bad) if bad else 'windows reconcile'}")
    for record in records:
        pending = f", {len(record.pending)} not yet published" if record.pending else ""
        print(f"{name} {record.asset}: {record.published} batches ({record.rows} rows) in every sink{pending}")
        for problem in record.problems:
            print(f"{name} {record.asset}: MISMATCH: {problem}")
        held = held and record.ok
    print(f"{name}: {'exactly-once holds' if held else 'exactly-once VIOLATED'}")
    return held


def verify_document(spark: SparkSession, pipelines: list[Pipeline], lake: LakeResource) -> dict[str, Any]:
    """The reconciliation of every pipeline as one JSON document; `holds` when exactly-once held everywhere."""
    documents = [pipeline_document(p.name, *reconcile_pipeline(spark, p, lake), reconcile_record_outputs(p, lake))
                 for p in pipelines]
    return {"home": lake.home, "holds": all(d["holds"] for d in documents), "pipelines": documents}


def verify(spark: SparkSession, pipelines: list[Pipeline], lake: LakeResource, as_json: bool = False) -> bool:
    """Print the reconciliation of every pipeline, each with a verdict of its own (as text, or one JSON document);
    True when exactly-once held everywhere."""
    if as_json:
        document = verify_document(spark, pipelines, lake)
        print(json.dumps(document, indent=2))
        return document["holds"]
    held = [print_pipeline(p.name, *reconcile_pipeline(spark, p, lake), reconcile_record_outputs(p, lake))
            for p in pipelines]
    return all(held)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While it lasts, whatever is written to the process's stdout (a Spark JVM's notes, on a classic session) goes
    to stderr: a command's JSON, printed after, is then all its stdout holds."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        pipelines = selected(load_pipelines(settings), args.pipeline)
        resources = resources_for(settings)
        if args.json:
            with stdout_to_stderr():
                document = verify_document(resources[SPARK].get_session(), pipelines, resources[LAKE])
            print(json.dumps(document, indent=2))
            ok = document["holds"]
        else:
            ok = verify(resources[SPARK].get_session(), pipelines, resources[LAKE])
    except Exception as error:
        print(f"onceflow verify: could not reconcile: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    return 0 if ok else 1


def add_selection(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--pipeline NAME` (repeatable) and `--json`, as `status` and `verify` take them."""
    parser.add_argument("--pipeline", action="append", metavar="NAME", help="only this pipeline (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of text")
    return parser
