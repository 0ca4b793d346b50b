"""Google's Pub/Sub emulator as a managed subprocess on a loopback port.

The gcloud wrapper starts a java child that holds the port; stopping only the wrapper leaves java running. The
emulator therefore runs in its own process group, and `stop` signals that whole group and then every process
that was in it, by PID.
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PubSubEmulator:
    """A running emulator; `host` is what `PUBSUB_EMULATOR_HOST` must be set to."""

    process: subprocess.Popen[bytes]
    host: str
    data_dir: Path
    log_path: Path
    _pids: set[int] = field(default_factory=set)

    def stop(self) -> None:
        pids = {self.process.pid} | self._pids | _group_members(self.process.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
                time.sleep(0.1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.1)
            if not any(_alive(pid) for pid in pids):
                return


def start_pubsub_emulator(port: int | None = None, timeout_s: float = 60.0) -> PubSubEmulator:
    """Start the emulator on 127.0.0.1 and wait until it answers its health check."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise RuntimeError("the Google Cloud CLI (`gcloud`) with its Pub/Sub emulator is required")
    port = port or free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="onceflow-pubsub-"))
    log_path = data_dir / "emulator.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [gcloud, "beta", "emulators", "pubsub", "start", f"--host-port=127.0.0.1:{port}",
         f"--data-dir={data_dir}", "--quiet"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    emulator = PubSubEmulator(process, f"127.0.0.1:{port}", data_dir, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        emulator._pids |= _group_members(process.pid)
        if process.poll() is not None:
            raise RuntimeError(f"Pub/Sub emulator exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{emulator.host}/", timeout=1) as response:
                if response.read().strip() == b"Ok":
                    emulator._pids |= _group_members(process.pid)
                    return emulator
        except OSError:
            time.sleep(0.2)
    emulator.stop()
    raise RuntimeError(f"Pub/Sub emulator did not answer on {emulator.host} within {timeout_s:.0f}s")


def _group_members(pgid: int) -> set[int]:
    members = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 of /proc/PID/stat: the process group
            members.add(int(entry.name))
    return members


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
