"""The whole lake on Google Cloud Storage (the GCS emulator): ingest, windows and published files with the home at
`gs://bucket/home`, read back with delta-rs and Google's client from the emulator, on both engine paths; and
homes onceflow cannot serve refused at load."""

from __future__ import annotations

import json
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from pyarrow.fs import FileSelector, FileType
from pyspark.sql import SparkSession

from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.delta.staging import remove_abandoned_staging
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.sinks import output_sinks, publish_closed
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.windows.panes import CloseStore, Window
from onceflow.jobs.windows.transform import materialize_windows
from onceflow.orchestration.workload import expected_raw, make_events, publish_events, with_publisher_retries
from onceflow.resources.delta_storage import table_files
from onceflow.resources.emulators.gcs import GcsEmulator
from onceflow.resources.emulators.pubsub import PubSubEmulator
from onceflow.resources.lake import LakeResource
from onceflow.resources.object_store import GcsStore
from onceflow.resources.settings import SettingsError, load_settings
from onceflow.resources.spark import with_gcs_settings
from tests.delta_reader import read_rows
from tests.pipelines import TOPIC, builtin, drain, events_from_files, events_pipeline, new_project, setup
from tests.test_windows import WINDOW_ROWS, expected_rows, five_window_workload, minute_base, write_events

RAW = ["record_id", "event_time", "key", "value"]


@pytest.fixture
def gcs_home(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """`ONCEFLOW_HOME` at `gs://<fresh bucket>/home` on the emulator."""
    bucket = f"onceflow-{uuid.uuid4().hex[:12]}"
    gcs_emulator.create_bucket(bucket)
    monkeypatch.setenv("ONCEFLOW_HOME", f"gs://{bucket}/home")
    return f"gs://{bucket}/home"


def published_rows(sink_root: str, window: Window) -> list[tuple]:
    """(key, count, sum_value, pane) of a window's pane files in the file sink on GCS."""
    store = GcsStore(sink_root)
    keys = [k for k in store.list(f"event_counts/window={window.key}/") if k.rsplit("/", 1)[-1].startswith("part-")]
    rows = [json.loads(line) for k in keys for line in (store.read(k) or b"").decode().splitlines()]
    return sorted((r["key"], r["count"], Decimal(r["sum_value"]), r["pane"]) for r in rows)


@pytest.mark.engine_paths
def test_ingest_windows_and_publish_on_a_gcs_home(
    spark: SparkSession, gcs_home: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = events_from_files(tmp_path, monkeypatch, max_files=1)
    with_gcs_settings(spark)  # the run's session was made before the home moved to gs://
    base = minute_base()
    events, _, _ = five_window_workload(base)  # 12 events in each of five windows
    pipeline, lake = builtin("events"), LakeResource(home=gcs_home)
    source = open_source(pipeline, lake)
    assert source.raw_path.startswith("gs://") and source.id_filters is not None
    # Three batches; the second and third repeat records of the one before; before the third the filters go back
    # to their copy after the first, as a restored backup would. A bad record in the first is redelivered in the
    # third: the dead-letter table's filters, on GCS too, find it held.
    batches = [events[:24], events[24:48] + events[:6], events[48:] + events[24:30]]
    bad = json.dumps({"event_id": "bad-1", "event_time": events[0].event_time_ms, "key": "k", "value": "n/a"})
    filters, results, saved = lake.filters(), [], {}
    for k, batch in enumerate(batches):
        write_events(incoming / f"{k}.jsonl", batch)
        if k in (0, 2):
            with (incoming / f"{k}.jsonl").open("a") as lines:
                lines.write(bad + "\n")
        if k == 1:
            IdFilterStore.settle()  # the first batch's filters are saved beside what follows it
            saved = {key: filters.read(key) for key in filters.list("")}
        if k == 2:
            IdFilterStore.settle()
            for key in filters.list(""):
                filters.delete(key)
            for key, data in saved.items():
                filters.write(key, data or b"")
            IdFilterStore.forget()  # as a new process finds them
        results.append(run_micro_batch(lambda: spark, source))

    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert [r.inserted for r in results] == [24, 24, 12] and [r.duplicates_committed for r in results] == [0, 6, 6]
    assert [(r.dead_lettered_new, r.dead_letter_duplicates) for r in results] == [(1, 0), (0, 0), (0, 1)]
    assert read_rows(source.dead_letter_path, ["record_id", "batch_id"]) == [("bad-1", 1)]
    # Maintenance finds a killed append's staging log on GCS too, and removes only that.
    files, root = table_files(source.raw_path)
    with files.open_output_stream(f"{root}/onceflow-killed/_delta_log/00000000000000000000.json") as log:
        log.write(b"{}\n")
    # No append of this process staged its files (delta-rs writes a Connect batch's rows; a classic session's
    # transaction writes them), so that log is the only one.
    assert remove_abandoned_staging(source.raw_path, 3_600, now_s=time.time() + 3_601) == 1
    assert files.get_file_info(f"{root}/onceflow-killed/_delta_log/00000000000000000000.json").type == FileType.NotFound
    assert not [i for i in files.get_file_info(FileSelector(root, recursive=True)) if "/_delta_log/" in i.path
                and i.path.split("/")[-3].startswith("onceflow-")]
    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert all(r.balances() for r in results)
    # The filters live on GCS and are kept up incrementally: built by the first batch, never rebuilt after; the
    # restored copy catches up on the second batch's commit from the Delta log on GCS.
    assert {key.split("/events/")[0] for key in saved} == {"raw", "dead_letter"}
    assert [r.fast_path["filters_rebuilt"] for r in results] == [True, False, False]
    assert results[2].fast_path["filters_caught_up_commits"] == 1

    output = pipeline.outputs[0]
    windows_path = lake.table_path(output.table)
    watermark = source_watermark_ms(source.checkpoints.load())
    assert watermark is not None
    windows = [Window(base + w * 60_000, base + (w + 1) * 60_000) for w in range(5)]
    closed = [w.end_ms + output.allowed_lateness_s * 1000 <= watermark for w in windows]
    assert closed[0] and not closed[-1]
    results = materialize_windows(spark, pipeline, output, windows, watermark, CloseStore(lake.panes(), output.asset),
                                  source.raw_path, windows_path)
    store = CommitStore(lake.commits())
    sinks = output_sinks(output, lake.sink_root(), lake.staging_root(), None)
    outcomes = publish_closed(spark, CommitContext(store), output, sinks, windows_path, results, "run", "run")

    expected = []
    for w, is_closed in enumerate(closed):
        pane, timing = (1, "on_time") if is_closed else (0, "early")
        expected += expected_rows(base, events, range(w, w + 1), pane, timing)
    assert read_rows(windows_path, WINDOW_ROWS) == sorted(expected)
    assert len(outcomes) == sum(closed) and store.unfinished() == []
    for window, is_closed in zip(windows, closed, strict=True):
        in_table = [(key, count, total, pane) for start, key, count, total, pane, _ in read_rows(windows_path, WINDOW_ROWS)
                    if int(start.timestamp() * 1000) == window.start_ms]
        assert published_rows(lake.sink_root(), window) == (in_table if is_closed else [])


@pytest.mark.engine_paths
def test_pubsub_batches_land_in_gcs_and_ingest_exactly_once(
    spark: SparkSession, gcs_home: str, pubsub_emulator: PubSubEmulator
) -> None:
    with_gcs_settings(spark)
    client, source = setup(new_project(), gcs_home, events_pipeline(max_messages=300))
    events = make_events(500, 1_763_720_000_000, 300_000, seed=3, prefix="p")
    stream = with_publisher_retries(events, 0.10)
    publish_events(client, TOPIC, stream)

    results = drain(lambda: spark, source)

    assert read_rows(source.raw_path, RAW) == expected_raw(events)
    assert sum(r.received for r in results) == len(stream) and sum(r.inserted for r in results) == 500
    assert all(r.balances() for r in results)
    # Spark read each batch from its landing file on GCS.
    plans = [source.checkpoints.get_plan(r.batch_id) for r in results]
    landed = GcsStore(f"{gcs_home}/landing").list("")
    assert sorted(p.landing_key for p in plans if p is not None) == landed and len(landed) == len(results) > 1


@pytest.mark.parametrize("home", ["s3://bucket/home", "abfss://c@account.dfs.core.windows.net/home", "gs://"])
def test_a_home_onceflow_cannot_serve_is_refused_at_load(home: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_HOME", home)
    with pytest.raises(SettingsError, match=r"ONCEFLOW_HOME=.*a local path or gs://bucket"):
        load_settings()
