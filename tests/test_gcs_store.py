"""The object stores on Google Cloud Storage (the GCS emulator, `tests.conftest.gcs_emulator`): create-if-absent, compare-and-swap,
and the ambiguity of a retried create whose first attempt succeeded."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties
from google.cloud import storage

from onceflow.jobs.publish.commit_records import DONE
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.pane_sequence import publish_pane
from onceflow.jobs.publish.sequence import run_sequence
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.checkpoint import CheckpointStore
from onceflow.jobs.windows.panes import Window
from onceflow.resources.delta_storage import delta_table, storage_options
from onceflow.resources.emulators.gcs import GcsEmulator
from onceflow.resources.object_store import GcsStore
from tests.gcs import LossyProxy

SCHEMA = [("window_start", "TIMESTAMP"), ("key", "STRING"), ("count", "INT64"), ("sum_value", "NUMERIC"),
          ("pane", "INT64")]


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator) -> str:
    name = f"onceflow-{uuid.uuid4().hex[:12]}"
    gcs_emulator.create_bucket(name)
    return name


def test_create_and_swap_on_gcs(bucket: str) -> None:
    store = GcsStore(f"gs://{bucket}/state")
    assert store.create("a.json", b"1") and not store.create("a.json", b"2")
    data, token = store.read_versioned("a.json")
    assert data == b"1"
    assert store.swap("a.json", b"3", token) and not store.swap("a.json", b"4", token)
    assert store.read("a.json") == b"3" and store.list("") == ["a.json"]


def test_checkpoint_updates_racing_on_gcs_lose_nothing(bucket: str) -> None:
    checkpoints = CheckpointStore(GcsStore(f"gs://{bucket}/checkpoints"), "events/pubsub")

    def add(name: str) -> None:
        for _ in range(10):
            checkpoints.update(lambda c: (c.totals.__setitem__(name, c.totals.get(name, 0) + 1), c)[1])

    writers = [threading.Thread(target=add, args=(f"w{i}",)) for i in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert checkpoints.load().totals == {"w0": 10, "w1": 10, "w2": 10}


def test_a_retried_create_that_had_succeeded_is_ours(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server stores the commit sequence, the answer is lost, the client retries: "already exists".
    proxy = LossyProxy(gcs_emulator.host, lambda method, path, body: method == "POST" and b"commits/sequences/" in body)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    try:
        store = CommitStore(GcsStore(f"gs://{bucket}/commits"))
        window = Window.from_partition_key("2026-11-21-10:05", 60)
        start = datetime.fromtimestamp(window.start_ms / 1000, UTC)
        rows = [{"window_start": start, "key": k, "count": 2, "sum_value": Decimal("1.5"), "pane": 1} for k in "ab"]
        published = publish_pane(store, asset="event_counts", window=window, pane=1, rows=rows, schema=SCHEMA,
                                 sink_root=f"gs://{bucket}/published")
        assert proxy.lost, "the proxy lost no answer: the ambiguity was not exercised"
        # Taken for someone else's, its temp files would have been deleted and the sequence could never finish.
        assert published.created
        assert run_sequence(CommitContext(store), published.sequence.id, "run-1").outcome == DONE
        finals = [b.name for b in storage.Client().list_blobs(bucket, prefix="published/")]
        assert finals == ["published/event_counts/window=2026-11-21-10:05/pane=1/part-00000.jsonl"]
    finally:
        proxy.stop()


def test_delta_rs_commits_on_gcs_keep_their_precondition(bucket: str) -> None:
    # Two writers that read the same version: the second one's commit fails instead of rebasing, on gs:// as on
    # local disk (what `delta_txn.append_once` relies on when it commits on the version the rows were found new at).
    path = f"gs://{bucket}/lake/t"
    write_deltalake(path, pa.table({"a": [1]}), storage_options=storage_options(path))
    first, second = delta_table(path), delta_table(path)
    no_rebase = CommitProperties(max_commit_retries=0)
    first.create_write_transaction([], "append", first.schema(), commit_properties=no_rebase)
    with pytest.raises(CommitFailedError):
        second.create_write_transaction([], "append", second.schema(), commit_properties=no_rebase)
    assert delta_table(path).version() == 1


def test_the_shim_keeps_the_xml_apis_create_precondition(gcs_emulator: GcsEmulator, bucket: str) -> None:
    # delta-rs writes a commit file as an XML API upload "only if absent": the second such upload must fail.
    def create(data: bytes) -> int:
        request = urllib.request.Request(f"{gcs_emulator.host}/{bucket}/t/_delta_log/0.json", data=data, method="PUT",
                                         headers={"x-goog-if-generation-match": "0"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as refused:
            return refused.code

    assert (create(b"first"), create(b"second")) == (200, 412)
    assert GcsStore(f"gs://{bucket}").read("t/_delta_log/0.json") == b"first"
