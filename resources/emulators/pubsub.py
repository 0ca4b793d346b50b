"""Google's Pub/Sub emulator as a managed subprocess on a loopback port.

The gcloud wrapper starts a java child that holds the port; stopping only the wrapper leaves java running. The
emulator therefore runs in its own process group, and `stop` signals every process that was ever seen in that
group (psutil), so none escapes by leaving it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from onceflow.resources.processes import listens

_HANDED_OUT: set[int] = set()


PORT_TRIES = 3
"""Ports tried in turn when a server onceflow starts chooses its own port and finds it taken."""


def free_port() -> int:
    """A loopback port free right now, never one this process handed out before.

    The kernel may give a just-released port again, so two servers started side by side (an emulator's HTTP and
    gRPC ports) could otherwise be told the same one.
    """
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


@dataclass
class PubSubEmulator:
    """A running emulator; `host` is what `PUBSUB_EMULATOR_HOST` must be set to."""

    process: subprocess.Popen[bytes]
    host: str
    data_dir: Path
    log_path: Path
    _members: dict[int, psutil.Process] = field(default_factory=dict)

    def stop(self) -> None:
        self._watch()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = []
            for process in self._members.values():
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(sig)
                    alive.append(process)
            _, alive = psutil.wait_procs(alive, timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.1)
            if not alive:
                return

    def _watch(self) -> None:
        """Remember every process now in the emulator's group (the wrapper's java child among them)."""
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(process.pid) == self.process.pid:
                    self._members.setdefault(process.pid, process)


def start_pubsub_emulator(port: int | None = None, timeout_s: float = 60.0) -> PubSubEmulator:
    """Start the emulator on 127.0.0.1 and wait until it answers its health check: on `port`, else on a free port
    (another one if a process takes the first before the emulator binds it)."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise RuntimeError("the Google Cloud CLI (`gcloud`) with its Pub/Sub emulator is required")
    for _ in range(0 if port else PORT_TRIES - 1):
        emulator = _launch(gcloud, free_port())
        if _answers(emulator, timeout_s):
            return emulator
        emulator.stop()
    emulator = _launch(gcloud, port or free_port())
    if _answers(emulator, timeout_s):
        return emulator
    emulator.stop()
    raise RuntimeError(f"another server answers on the Pub/Sub emulator's port: {emulator.host}")


def _launch(gcloud: str, port: int) -> PubSubEmulator:
    data_dir = Path(tempfile.mkdtemp(prefix="onceflow-pubsub-"))
    log_path = data_dir / "emulator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [gcloud, "beta", "emulators", "pubsub", "start", f"--host-port=127.0.0.1:{port}",
             f"--data-dir={data_dir}", "--quiet"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return PubSubEmulator(process, f"127.0.0.1:{port}", data_dir, log_path)


def _answers(emulator: PubSubEmulator, timeout_s: float) -> bool:
    """True once the emulator answers its health check; False when another process answers on its port."""
    port = int(emulator.host.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        emulator._watch()
        if emulator.process.poll() is not None:
            raise RuntimeError(f"Pub/Sub emulator exited: {emulator.log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{emulator.host}/", timeout=1) as response:
                if response.read().strip() == b"Ok":
                    emulator._watch()
                    return listens(emulator.process, port)
        except OSError:
            time.sleep(0.2)
    emulator.stop()
    raise RuntimeError(f"Pub/Sub emulator did not answer on {emulator.host} within {timeout_s:.0f}s")
