"""A real PostgreSQL server for tests, and Dagster instances on it with the production `dagster.yaml`."""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from onceflow.orchestration.instance import INSTANCE_CONFIGS
from onceflow.resources.emulators.postgres import (
    PostgresServer,
    PostgresUnavailable,
    ensure_postgres,
    start_postgres,
)
from tests.conftest import require


def require_postgres() -> None:
    """Install PostgreSQL when missing (as root, with apt-get); skip if that cannot be done, fail under CI=true."""
    try:
        ensure_postgres()
    except PostgresUnavailable as missing:
        require(False, str(missing))


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A server of its own per test module."""
    require_postgres()
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


def fresh_database(server: PostgresServer) -> PostgresServer:
    """The server with a new, empty database of its own, so tests sharing the server share no runs."""
    name = f"dagster_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(server.url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sa.text(f"CREATE DATABASE {name}"))
    finally:
        engine.dispose()
    return dataclasses.replace(server, database=name)


def postgres_instance(server: PostgresServer, dagster_home: Path, monkeypatch: pytest.MonkeyPatch) -> dg.DagsterInstance:
    """A Dagster instance configured by deploy/dagster.prod.yaml, its connection read from the environment."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(INSTANCE_CONFIGS["postgres"], dagster_home / "dagster.yaml")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return dg.DagsterInstance.from_config(str(dagster_home))


def query(server: PostgresServer, sql: str, **params: object) -> list[tuple]:
    """Rows of `sql` run on the server itself, not through Dagster."""
    engine = sa.create_engine(server.url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(sql), params)]
    finally:
        engine.dispose()
