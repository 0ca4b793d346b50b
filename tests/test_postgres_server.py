"""The PostgreSQL server the tests and the demo start: loopback only, a password over TCP, and nothing left behind."""

from __future__ import annotations

import dataclasses
import os

import pytest
import sqlalchemy as sa

from onceflow.resources.emulators.postgres import start_postgres
from tests.postgres import query, require_postgres


def test_a_server_on_loopback_with_a_password_that_stop_removes_entirely() -> None:
    require_postgres()
    server = start_postgres()
    try:
        assert query(server, "SHOW listen_addresses") == [("127.0.0.1",)]
        assert query(server, "SELECT current_user, current_database()") == [("onceflow", "dagster")]
        with pytest.raises(sa.exc.OperationalError, match="password authentication failed"):
            query(dataclasses.replace(server, password="wrong"), "SELECT 1")
        group = os.getpgid(server.process.pid)
        assert group == server.process.pid  # its own process group, which `stop` ends
    finally:
        server.stop()
    assert server.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)  # signal 0: is any process of the group left?
    assert not server.workdir.exists()
