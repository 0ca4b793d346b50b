"""`table_snapshot`: a table read at its newest version is given again only while its log has no later commit and
its commit file is the one it was read from, on local disk and on GCS (the emulator); a table re-created or
restored at the same path is read anew. `writable_table`: a table to write is moved forward through the commits since
the one it was given at, and read anew when it was re-created; the replay check's reads of a log follow every commit,
and read this process's own last commit from what it noted, on any thread, whichever way the table's URI is spelt."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction
from google.cloud import storage

from onceflow.jobs.delta.arrow_append import append_arrow_once
from onceflow.resources.delta_storage import (
    REREAD_VERSIONS,
    newest_version,
    storage_options,
    table_head,
    table_snapshot,
    transaction_version,
    writable_table,
)
from onceflow.resources.emulators.gcs import GcsEmulator


def _ids(uri: str) -> list[str]:
    return sorted(table_snapshot(uri).to_pyarrow_table(columns=["record_id"])["record_id"].to_pylist())


def _append(uri: str, *ids: str, mode: str = "append") -> None:
    write_deltalake(uri, pa.table({"record_id": list(ids)}), mode=mode, storage_options=storage_options(uri))


def _forget(uri: str) -> None:
    """Remove every object of the table at `uri` (a `gs://` one)."""
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    for blob in storage.Client().list_blobs(bucket, prefix=f"{prefix}/"):
        blob.delete()


@pytest.fixture(params=["local", "gcs"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Callable[[str], None]]:
    """Where a test's table lives, on local disk or on GCS (the emulator), and how to remove it whole."""
    if request.param == "local":
        return str(tmp_path / "t"), shutil.rmtree
    emulator: GcsEmulator = request.getfixturevalue("gcs_emulator")
    bucket = f"onceflow-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(bucket)
    return f"gs://{bucket}/lake/t", _forget


def _check(uri: str, remove: Callable[[str], None]) -> None:
    _append(uri, "a")
    first = table_snapshot(uri)
    assert first.version() == 0 and table_snapshot(uri) is first  # nothing new: the same table, not read again
    assert table_snapshot(uri, 0) is first
    _append(uri, "b")  # another writer commits
    second = table_snapshot(uri)
    assert second is not first and second.version() == 1 and _ids(uri) == ["a", "b"]
    assert first.version() == 0  # a table once given never moves under its holder
    old = table_snapshot(uri, 0)
    assert old is not second and old.version() == 0 and table_snapshot(uri) is second
    # The table is re-created at the same path with as many commits: its newest commit file is another one.
    remove(uri)
    _append(uri, "x")
    _append(uri, "y")
    assert table_snapshot(uri) is not second and _ids(uri) == ["x", "y"]
    # Restored from an older copy: fewer commits than the table given last.
    remove(uri)
    _append(uri, "z")
    assert table_snapshot(uri).version() == 0 and _ids(uri) == ["z"]


def test_a_table_is_read_again_only_when_its_log_changed(place: tuple[str, Callable[[str], None]]) -> None:
    _check(*place)


def test_a_table_that_is_gone_is_not_given(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _append(uri, "a")
    assert table_snapshot(uri).version() == 0
    shutil.rmtree(uri)
    with pytest.raises(TableNotFoundError):
        table_snapshot(uri)


def _files(table: DeltaTable) -> list[str]:
    return sorted(table.file_uris())


def _check_writable(uri: str, remove: Callable[[str], None]) -> None:
    _append(uri, "a")
    given = writable_table(uri, 0)
    write_deltalake(given, pa.table({"record_id": ["b"]}), mode="append")  # through it: it moves to version 1
    _append(uri, "c")  # another writer: version 2
    moved = writable_table(uri, 2)
    assert moved is given and moved.version() == 2 and _files(moved) == _files(DeltaTable(uri, storage_options=storage_options(uri)))
    older = writable_table(uri, 1)
    assert older is not moved and older.version() == 1 and len(_files(older)) == 2
    # Re-created at the same path with more commits: the commit file it was given at is another one.
    remove(uri)
    for record in ("x", "y", "z", "w"):
        _append(uri, record)
    again = writable_table(uri, 3)
    assert again is not older and again.version() == 3
    assert sorted(again.to_pyarrow_table()["record_id"].to_pylist()) == ["w", "x", "y", "z"]


def test_a_table_to_write_moves_forward_and_is_read_anew_when_recreated(place: tuple[str, Callable[[str], None]]) -> None:
    _check_writable(*place)


def _commit_batch(uri: str, batch: int) -> None:
    write_deltalake(uri, pa.table({"record_id": [f"r{batch}"]}), mode="append", storage_options=storage_options(uri),
                    commit_properties=CommitProperties(app_transactions=[Transaction("app", batch)]))


def _check_log_reads(uri: str, remove: Callable[[str], None]) -> None:
    """The replay check's reads follow every commit, past `REREAD_VERSIONS` and across a re-creation."""
    for batch in range(1, REREAD_VERSIONS + 4):
        _commit_batch(uri, batch)
        assert (transaction_version(uri, "app"), newest_version(uri)) == (batch, batch - 1)
    _append(uri, "other")  # another writer, no transaction of the app
    assert (transaction_version(uri, "app"), newest_version(uri)) == (REREAD_VERSIONS + 3, REREAD_VERSIONS + 3)
    remove(uri)
    _append(uri, "x")
    assert (transaction_version(uri, "app"), newest_version(uri)) == (None, 0)
    _commit_batch(uri, 7)
    assert (transaction_version(uri, "app"), newest_version(uri)) == (7, 1)


def test_a_tables_log_reads_follow_every_commit(place: tuple[str, Callable[[str], None]]) -> None:
    _check_log_reads(*place)


def _check_reads_after_own_writes(uri: str, remove: Callable[[str], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """After this process's commit (`append_arrow_once`, on a thread of its own as a batch's dead letters are), the
    replay check and the filters read it on any thread without following the log; asking for another app id, a
    commit by another writer, or a re-creation is still seen."""
    _commit_batch(uri, 1)
    committer = ThreadPoolExecutor(1)

    def commit(batch: int) -> str:
        written = writable_table(uri, newest_version(uri))
        assert append_arrow_once(written, pa.table({"record_id": [f"r{batch}"]}), "app", batch, {})
        return written.table_uri

    for batch in range(2, 5):
        spelt = committer.submit(commit, batch).result()
        with monkeypatch.context() as patched:
            patched.setattr(DeltaTable, "update_incremental", lambda _: pytest.fail("the log was followed"))
            head = (transaction_version(uri, "app"), newest_version(uri), table_head(uri))
            assert head == (batch, batch - 1, (batch - 1, table_snapshot(uri, 0).metadata().id))
            # Asked by the name delta-rs gives it (`file:///.../t/`), the same table.
            assert (transaction_version(spelt, "app"), newest_version(spelt)) == (batch, batch - 1)
        assert transaction_version(uri, "another app") is None
    _append(uri, "other")  # another writer, no transaction of the app
    assert (transaction_version(uri, "app"), newest_version(uri)) == (4, 4)
    committer.submit(commit, 5).result()
    assert (transaction_version(uri, "app"), newest_version(uri)) == (5, 5)
    remove(uri)  # re-created with as many commits, none of the app's: the newest commit file is another one
    for record in range(6):
        _append(uri, f"x{record}")
    assert (transaction_version(uri, "app"), newest_version(uri), table_head(uri)[0]) == (None, 5, 5)
    committer.shutdown()


def test_the_replay_check_reads_this_processs_own_commit_on_any_thread(
    place: tuple[str, Callable[[str], None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_reads_after_own_writes(*place, monkeypatch)
