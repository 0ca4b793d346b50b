"""The servers onceflow starts on ports they choose are ready only when they listen there themselves: a port chosen
free can be taken before the server binds it (by a server another process starts, such as another test worker's
emulator), and then something answers on it that is not the server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from onceflow.resources import spark_connect
from onceflow.resources.emulators import pubsub
from onceflow.resources.processes import listens
from tests.conftest import require


class _Ok(BaseHTTPRequestHandler):
    """Answers as the Pub/Sub emulator's health check does."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"Ok")

    def log_message(self, *args: object) -> None:
        return


@contextmanager
def _squatter() -> Iterator[int]:
    """Another process's server on a loopback port: its port, answering as an emulator does."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_connect_server_whose_port_another_server_takes_first_binds_another(monkeypatch: pytest.MonkeyPatch) -> None:
    require(shutil.which("java") is not None, "Java 17")
    with _squatter() as taken:
        ports = iter([taken, pubsub.free_port()])
        monkeypatch.setattr(spark_connect, "free_port", lambda: next(ports))
        server = spark_connect.start_spark_connect_server(driver_memory="1g")
        try:
            assert server.port != taken and listens(server.process, server.port)
            assert not listens(server.process, taken)
            # A session of its own process: this one's default session is the tests' shared engine's.
            counted = subprocess.run(
                [sys.executable, "-c", "import sys; from pyspark.sql import SparkSession; "
                 "print(SparkSession.builder.remote(sys.argv[1]).getOrCreate().range(3).count())", server.url],
                capture_output=True, text=True, timeout=120, check=False,
            )
            assert counted.stdout.split() == ["3"], counted.stderr[-2000:]
        finally:
            server.stop()


def test_a_pubsub_emulator_whose_port_another_server_takes_first_binds_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require(shutil.which("gcloud") is not None, "the Google Cloud CLI with its Pub/Sub emulator")
    with _squatter() as taken:
        ports = iter([taken, pubsub.free_port()])
        monkeypatch.setattr(pubsub, "free_port", lambda: next(ports))
        emulator = pubsub.start_pubsub_emulator()
        try:
            port = int(emulator.host.rsplit(":", 1)[1])
            assert port != taken and listens(emulator.process, port)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        finally:
            emulator.stop()
