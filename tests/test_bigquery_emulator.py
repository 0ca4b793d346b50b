"""The local BigQuery bigquery_emulator: set-up, lifecycle and the idempotency behaviours the platform relies on."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any, TypeVar

import pytest
from google.api_core.exceptions import Conflict
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery

from onceflow.resources.emulators import bigquery as bigquery_module
from onceflow.resources.emulators.bigquery import (
    BigQueryEmulator,
    ensure_bigquery_emulator_env,
    start_bigquery_emulator,
)
from onceflow.resources.emulators.pubsub import free_port

T = TypeVar("T")
IN_CI = os.environ.get("CI", "").lower() == "true"
SCHEMA = [bigquery.SchemaField("id", "INT64", mode="REQUIRED"), bigquery.SchemaField("v", "STRING")]
ROWS = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]


@pytest.fixture
def dataset(bigquery_client: bigquery.Client) -> str:
    """A new, empty dataset for one test."""
    return bigquery_client.create_dataset(f"test_{uuid.uuid4().hex[:12]}").dataset_id


def new_table(bigquery_client: bigquery.Client, dataset: str, name: str = "t") -> bigquery.Table:
    return bigquery_client.create_table(bigquery.Table(f"{bigquery_client.project}.{dataset}.{name}", schema=SCHEMA))


def rows(bigquery_client: bigquery.Client, table: bigquery.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(row.values()) for row in bigquery_client.query_and_wait(f"SELECT id, v FROM `{table}`"))


def listening_addresses(port: int) -> set[str]:
    """The local addresses on which some socket listens on `port`, read from /proc/net/tcp{,6}."""
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word of the address in host (little-endian) byte order.
            found.add(socket.inet_ntop(family, b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))))
    return found


def test_environment_set_up_is_stamped(bigquery_emulator: BigQueryEmulator) -> None:
    venv = ensure_bigquery_emulator_env()
    assert ensure_bigquery_emulator_env() == venv
    assert (venv / "bin" / "local-bigquery").is_file()
    extensions = venv / "duckdb-home" / ".duckdb" / "extensions" / "v1.5.5" / "linux_amd64"
    assert sorted(path.name for path in extensions.glob("*.duckdb_extension")) == [
        "ducklake.duckdb_extension", "icu.duckdb_extension", "spatial.duckdb_extension",
    ]


def test_dataset_and_table_are_created(bigquery_client: bigquery.Client, dataset: str) -> None:
    table = new_table(bigquery_client, dataset)

    fetched = bigquery_client.get_table(f"{dataset}.t")
    assert [(field.name, field.field_type, field.mode) for field in fetched.schema] == [
        ("id", "INTEGER", "REQUIRED"), ("v", "STRING", "NULLABLE"),
    ]
    assert [item.table_id for item in bigquery_client.list_tables(dataset)] == ["t"]
    assert dataset in {item.dataset_id for item in bigquery_client.list_datasets()}
    assert rows(bigquery_client, table) == []


def test_insert_ids_deduplicate_a_retried_insert(bigquery_client: bigquery.Client, dataset: str) -> None:
    table = new_table(bigquery_client, dataset)

    assert bigquery_client.insert_rows_json(table, ROWS, row_ids=["r1", "r2"]) == []
    assert bigquery_client.insert_rows_json(table, ROWS, row_ids=["r1", "r2"]) == []
    assert rows(bigquery_client, table) == [(1, "a"), (2, "b")]

    # Deduplication is by insert id, not by content: the same row under a new id is a new row.
    assert bigquery_client.insert_rows_json(table, ROWS[:1], row_ids=["r3"]) == []
    assert rows(bigquery_client, table) == [(1, "a"), (1, "a"), (2, "b")]


@pytest.mark.parametrize(
    ("source_format", "payload"),
    [
        (bigquery.SourceFormat.NEWLINE_DELIMITED_JSON, b'{"id": 1, "v": "a"}\n{"id": 2, "v": "b"}\n'),
        (bigquery.SourceFormat.CSV, b"1,a\n2,b\n"),
    ],
)
def test_reused_load_job_id_conflicts(
    bigquery_client: bigquery.Client, dataset: str, source_format: str, payload: bytes
) -> None:
    table = new_table(bigquery_client, dataset)
    config = bigquery.LoadJobConfig(source_format=source_format, schema=SCHEMA)
    job_id = f"load-{uuid.uuid4().hex}"

    first = bigquery_client.load_table_from_file(io.BytesIO(payload), table, job_id=job_id, job_config=config)
    first.result()
    assert first.output_rows == 2
    with pytest.raises(Conflict):
        bigquery_client.load_table_from_file(io.BytesIO(payload), table, job_id=job_id, job_config=config).result()

    assert rows(bigquery_client, table) == [(1, "a"), (2, "b")]
    kept = bigquery_client.get_job(job_id)
    assert (kept.job_type, kept.state, kept.output_rows) == ("load", "DONE", 2)


def test_reused_query_job_id_conflicts(bigquery_client: bigquery.Client, dataset: str) -> None:
    table = new_table(bigquery_client, dataset)
    statement = f"INSERT INTO `{table}` (id, v) VALUES (1, 'a'), (2, 'b')"
    job_id = f"query-{uuid.uuid4().hex}"

    first = bigquery_client.query(statement, job_id=job_id, job_retry=None)
    first.result()
    assert first.num_dml_affected_rows == 2
    with pytest.raises(Conflict):
        bigquery_client.query(statement, job_id=job_id, job_retry=None).result()

    assert rows(bigquery_client, table) == [(1, "a"), (2, "b")]
    assert bigquery_client.get_job(job_id).state == "DONE"


def test_merge_upserts_and_is_idempotent(bigquery_client: bigquery.Client, dataset: str) -> None:
    table = new_table(bigquery_client, dataset)
    assert bigquery_client.insert_rows_json(table, ROWS) == []
    merge = f"""
        MERGE `{table}` AS target
        USING (SELECT 2 AS id, 'B' AS v UNION ALL SELECT 3, 'c') AS source
        ON target.id = source.id
        WHEN MATCHED THEN UPDATE SET v = source.v
        WHEN NOT MATCHED THEN INSERT (id, v) VALUES (source.id, source.v)
    """

    first = bigquery_client.query(merge)
    first.result()
    assert first.num_dml_affected_rows == 2
    assert rows(bigquery_client, table) == [(1, "a"), (2, "B"), (3, "c")]

    bigquery_client.query_and_wait(merge)
    assert rows(bigquery_client, table) == [(1, "a"), (2, "B"), (3, "c")]


def test_bigquery_emulator_host_variable_reaches_the_emulator(
    bigquery_emulator: BigQueryEmulator, dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BIGQUERY_EMULATOR_HOST", bigquery_emulator.endpoint)
    plain = bigquery.Client(project=bigquery_emulator.project, credentials=AnonymousCredentials())
    try:
        assert dataset in {item.dataset_id for item in plain.list_datasets()}
    finally:
        plain.close()


def test_serves_on_loopback_only_and_stop_ends_the_process_group(bigquery_emulator: BigQueryEmulator) -> None:
    running = start_bigquery_emulator()  # a second one of its own, to stop
    try:
        assert listening_addresses(running.port) == {"127.0.0.1"}
        assert listening_addresses(running.grpc_port) <= {"127.0.0.1", "::ffff:127.0.0.1"}
        assert listening_addresses(running.grpc_port)
        assert running.data_dir.is_dir()
    finally:
        running.stop()

    with pytest.raises(ProcessLookupError):
        os.killpg(running.process.pid, 0)  # signal 0: only checks the group exists
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", running.port), timeout=2):
        pass
    assert not running.work_dir.exists()
    running.stop()  # a second stop is harmless


class NotHttpServer:
    """A loopback server that answers every connection with bytes that are no HTTP (as a gRPC server would)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.answered = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.socket.accept()
                with connection:
                    connection.sendall(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x7f\xff\xff\xff\n")
                    self.answered += 1


def test_a_port_taken_by_another_server_is_given_up_for_new_ports(
    bigquery_emulator: BigQueryEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = NotHttpServer()
    ports = iter([taken.port])
    monkeypatch.setattr(bigquery_module, "free_port", lambda: next(ports, None) or free_port())
    running = start_bigquery_emulator()
    try:
        assert taken.answered >= 1
        assert running.port != taken.port
        running.client().create_dataset("answered")
        assert "answered" in {d.dataset_id for d in running.client().list_datasets()}
    finally:
        running.stop()
        taken.socket.close()


def test_a_given_port_taken_by_another_server_fails_naming_it() -> None:
    taken = NotHttpServer()
    try:
        with pytest.raises(RuntimeError, match=f"another server kept answering on the emulator's port {taken.port}"):
            start_bigquery_emulator(port=taken.port)
    finally:
        taken.socket.close()
