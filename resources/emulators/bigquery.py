"""A local BigQuery emulator (`local-bigquery`) as a managed subprocess on a loopback port.

`local-bigquery` serves the BigQuery REST API (and the Storage API over gRPC) on DuckDB. It deduplicates
`insertAll` rows by insert id (best effort, in memory, like BigQuery), answers 409 Conflict when a job id is
reused (loads and queries) and runs MERGE. It needs Python 3.13, so it lives in a virtualenv of its own, created
once under a cache directory by `ensure_bigquery_emulator_env` with every package pinned to a tested version.

DuckDB loads its `ducklake`, `icu` and `spatial` extensions from `$HOME/.duckdb/extensions` and otherwise tries to
download them, which fails offline. The `duckdb-extension-*` wheels carry the extension binaries; set-up installs
them into a DuckDB home inside the virtualenv, and the emulator runs with `HOME` pointing there.

The server runs in its own process group on 127.0.0.1 and `stop` signals that group.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from onceflow.resources.emulators.pubsub import PORT_TRIES, free_port
from onceflow.resources.processes import listens, stop_process_group
from onceflow.resources.settings import load_settings

if TYPE_CHECKING:
    from google.cloud import bigquery

PYTHON_VERSION = (3, 13)
DUCKDB_EXTENSIONS = ("ducklake", "icu", "spatial")
# local-bigquery 0.4.0 needs duckdb>=2.0, for which no extension wheels exist, so 0.3.2 (duckdb 1.5.5) it is.
# The rest is the resolved set that was tested: an unpinned transitive upgrade (sqlglot, fastapi...) could change
# the emulator's behaviour under the tests without any change here.
REQUIREMENTS = (
    "local-bigquery==0.3.2",
    "duckdb==1.5.5",
    *(f"duckdb-extension-{name}==1.5.5" for name in DUCKDB_EXTENSIONS),
    "annotated-doc==0.0.7", "annotated-types==0.8.0", "anyio==4.16.0", "certifi==2026.10.18", "cffi==2.1.1",
    "charset-normalizer==3.5.2", "click==8.5.1", "cryptography==50.0.2", "fastapi==0.165.0", "fastavro==1.13.1",
    "google-api-core==2.44.0", "google-auth==2.62.2", "google-cloud-bigquery-storage==2.43.0",
    "googleapis-common-protos==1.76.0", "grpcio==1.85.1", "grpcio-status==1.85.1", "h11==0.16.0", "idna==3.20",
    "mini-racer==0.14.1", "numpy==2.5.5", "opentelemetry-api==1.45.2", "prompt-toolkit==3.0.53",
    "proto-plus==1.29.0", "protobuf==7.36.2", "pyarrow==26.0.1", "pyasn1==0.6.5", "pyasn1-modules==0.4.2",
    "pycparser==3.12", "pydantic==2.14.3", "pydantic-core==2.50.4", "pydantic-settings==2.16.3",
    "pygments==2.21.0", "python-dotenv==1.2.4", "requests==2.34.2", "sqlglot==30.30.0", "starlette==1.10.0",
    "typing-extensions==4.16.0", "typing-inspection==0.4.5", "urllib3==2.8.0", "uvicorn==0.54.0",
    "wcwidth==0.9.4",
)
STAMP_NAME = ".onceflow-installed"

# Runs inside the emulator's virtualenv with HOME set to its DuckDB home. The final check connects the way
# local-bigquery does (TimeZone needs icu) with auto-install off, so a missing extension fails here, not later.
_INSTALL_EXTENSIONS = """
import importlib, pathlib, sys
import duckdb
pathlib.Path.home().mkdir(exist_ok=True)
con = duckdb.connect()
version = con.sql("PRAGMA version").fetchone()[0]
for name in sys.argv[1:]:
    package = pathlib.Path(importlib.import_module("duckdb_extension_" + name).__file__).parent
    binary = package / "extensions" / version / (name + ".duckdb_extension")
    con.execute("FORCE INSTALL '" + str(binary) + "'")
check = duckdb.connect(config={"TimeZone": "UTC", "autoinstall_known_extensions": False})
for name in sys.argv[1:]:
    check.execute("LOAD " + name)
"""


class BigQueryEmulatorUnavailable(RuntimeError):
    """The machine lacks something the emulator needs that set-up cannot install (a Python 3.13 interpreter)."""


def emulator_cache_dir() -> Path:
    """`ONCEFLOW_BQ_EMULATOR_DIR`, else `~/.cache/onceflow/bigquery-emulator`: shared by every checkout."""
    configured = load_settings().bq_emulator_dir
    return Path(configured) if configured else Path.home() / ".cache" / "onceflow" / "bigquery-emulator"


def find_python313() -> Path:
    """The real executable of a Python 3.13 interpreter: `python3.13` on PATH, else pyenv's newest 3.13.x.

    Each candidate is run to check its version, because a pyenv shim is on PATH even when no 3.13 is selected
    and then fails. Raises `BigQueryEmulatorUnavailable` when none is found.
    """
    candidates = [found] if (found := shutil.which("python3.13")) else []
    pyenv_root = _pyenv_root()
    installed = sorted(
        pyenv_root.glob("versions/3.13.*/bin/python3.13"),
        key=lambda path: [int(part) if part.isdigit() else -1 for part in path.parts[-3].split(".")],
        reverse=True,
    )
    candidates += [str(path) for path in installed]
    probe = f"import sys; print(sys.version_info[:2] == {PYTHON_VERSION!r}); print(sys.executable)"
    for candidate in candidates:
        try:
            answer = subprocess.run(
                [candidate, "-c", probe], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split("\n")
        except (OSError, subprocess.SubprocessError):
            continue
        if answer[0] == "True" and answer[1]:
            return Path(answer[1])
    raise BigQueryEmulatorUnavailable(
        "the BigQuery emulator (local-bigquery) needs a Python 3.13 interpreter: none was found as `python3.13` "
        f"on PATH or under {pyenv_root}/versions/3.13.*/bin/python3.13 (e.g. `pyenv install 3.13`). "
        "crucible-emulator[server] runs on Python 3.11 but has no insertAll (no insert-id deduplication) and "
        "is not wired in."
    )


def ensure_bigquery_emulator_env(cache_dir: Path | None = None, python: Path | None = None) -> Path:
    """Return the emulator's virtualenv, creating it first if needed.

    The virtualenv is `<cache_dir>/local-bigquery-<hash>`, the hash covering the interpreter version and
    `REQUIREMENTS`, so a change of pins builds a new one beside the old. It holds the pinned packages from
    PyPI and a DuckDB home (`duckdb-home/`) with the extensions installed from their wheels, so the emulator
    starts without network. A stamp file written last marks it complete: a later call only reads the stamp.
    Concurrent callers are serialised by a lock file; an interrupted build is redone from scratch.
    `python` defaults to `find_python313()`; raises `BigQueryEmulatorUnavailable` when there is none, and
    `RuntimeError` with pip's output when installing fails.
    """
    cache_dir = cache_dir or emulator_cache_dir()
    stamp_text = "\n".join((".".join(map(str, PYTHON_VERSION)), *REQUIREMENTS)) + "\n"
    key = hashlib.sha256(stamp_text.encode()).hexdigest()[:12]
    venv = cache_dir / f"local-bigquery-{key}"
    if _complete(venv, stamp_text):
        return venv
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(venv, stamp_text):  # another process finished it while this one waited
            return venv
        interpreter = python or find_python313()
        log_path = cache_dir / f"{venv.name}.install.log"
        python_env = _python_env()
        steps = (
            ("create virtualenv", [str(interpreter), "-m", "venv", "--clear", str(venv)], python_env),
            ("install packages", [str(venv / "bin" / "python"), "-m", "pip", "install",
                                  "--disable-pip-version-check", "--only-binary=:all:", *REQUIREMENTS], python_env),
            ("install DuckDB extensions", [str(venv / "bin" / "python"), "-c", _INSTALL_EXTENSIONS,
                                           *DUCKDB_EXTENSIONS], _emulator_env(venv)),
        )
        with log_path.open("w") as log:
            for step, command, env in steps:
                log.write(f"== {step}\n")
                log.flush()
                result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
                if result.returncode != 0:
                    raise RuntimeError(
                        f"setting up the BigQuery emulator failed (full log: {log_path}):\n"
                        f"{log_path.read_text(errors='replace')[-3000:]}"
                    )
        partial = venv / f"{STAMP_NAME}.part"
        partial.write_text(stamp_text)
        partial.replace(venv / STAMP_NAME)
    return venv


@dataclass
class BigQueryEmulator:
    """A running emulator.

    `endpoint` is the REST root: what `client_options={"api_endpoint": ...}` or `BIGQUERY_EMULATOR_HOST` must be
    set to (clients still need anonymous credentials, or they look for Google ones). `grpc_address` serves the
    BigQuery Storage Read and Write APIs over plain gRPC. Its data and log live in `work_dir` until `stop`.
    """

    process: subprocess.Popen[bytes]
    project: str
    port: int
    grpc_port: int
    work_dir: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "emulator.log"

    def client(self, project: str | None = None) -> bigquery.Client:
        """A BigQuery client for `project` (default: the emulator's) that talks to this emulator, unauthenticated."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import bigquery

        return bigquery.Client(
            project=project or self.project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def stop(self) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after 15 s), then delete `work_dir`; idempotent."""
        stop_process_group(self.process)
        shutil.rmtree(self.work_dir, ignore_errors=True)


def start_bigquery_emulator(
    project: str = "onceflow-local",
    port: int | None = None,
    timeout_s: float = 60.0,
    venv: Path | None = None,
) -> BigQueryEmulator:
    """Start the emulator on 127.0.0.1 with an empty data directory and wait until its API answers.

    `venv` defaults to `ensure_bigquery_emulator_env()` (which sets it up on first use). The gRPC port is
    another free port. Ready means listing `project`'s datasets succeeded, which opens the DuckDB catalogue
    and so proves the extensions load. A server that exits, answers with an error or does not answer within
    `timeout_s` is stopped and a `RuntimeError` carrying the end of its log is raised. A free port can be taken
    by another process before the emulator binds it (tests start servers side by side): when something that
    is not HTTP answers on it, the emulator starts again on new ports, at most three times, unless `port` was
    given.
    """
    venv = venv or ensure_bigquery_emulator_env()
    for _ in range(1 if port else PORT_TRIES):
        emulator = _launch(venv, project, port or free_port())
        if _ready(emulator, timeout_s):
            return emulator
        emulator.stop()
    _fail(emulator, f"another server kept answering on the emulator's port {emulator.port}")


def _launch(venv: Path, project: str, port: int) -> BigQueryEmulator:
    grpc_port = free_port()
    work_dir = Path(tempfile.mkdtemp(prefix="onceflow-bigquery-"))
    command = [
        str(venv / "bin" / "local-bigquery"), "serve",
        "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
        "--project", project, "--data-dir", str(work_dir / "data"),
    ]
    with (work_dir / "emulator.log").open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=_emulator_env(venv), start_new_session=True
        )
    return BigQueryEmulator(process, project, port, grpc_port, work_dir)


def _ready(emulator: BigQueryEmulator, timeout_s: float) -> bool:
    """True once the emulator answers; False when another server answers on its port (one that is not HTTP, or
    one another process runs)."""
    probe = f"{emulator.endpoint}/bigquery/v2/projects/{emulator.project}/datasets"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if emulator.process.poll() is not None:
            _fail(emulator, f"BigQuery emulator exited with code {emulator.process.returncode}")
        try:
            with urllib.request.urlopen(probe, timeout=5) as response:
                response.read()
                return listens(emulator.process, emulator.port)
        except urllib.error.HTTPError as error:
            _fail(emulator, f"BigQuery emulator answered {error.code}: {error.read().decode(errors='replace')}")
        except http.client.HTTPException:
            return False
        except OSError:
            time.sleep(0.1)
    _fail(emulator, f"BigQuery emulator did not answer on {emulator.endpoint} within {timeout_s:.0f}s")


def _fail(emulator: BigQueryEmulator, reason: str) -> NoReturn:
    try:
        log = emulator.log_path.read_text(errors="replace")[-3000:]
    except OSError:
        log = ""
    emulator.stop()
    raise RuntimeError(f"{reason}\n--- end of the emulator's log:\n{log}")


def _python_env() -> dict[str, str]:
    # Both would point the 3.13 interpreter at the caller's 3.11 packages.
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}


def _emulator_env(venv: Path) -> dict[str, str]:
    env = _python_env()
    # DuckDB looks for extensions under $HOME/.duckdb: this points it at the ones installed from the wheels.
    env["HOME"] = str(venv / "duckdb-home")
    return env


def _pyenv_root() -> Path:
    if pyenv := shutil.which("pyenv"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30, check=True)
            if root.stdout.strip():
                return Path(root.stdout.strip())
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def _complete(venv: Path, stamp_text: str) -> bool:
    # The interpreter check catches a virtualenv whose base Python was removed (a pyenv version uninstalled).
    try:
        return (venv / STAMP_NAME).read_text() == stamp_text and (venv / "bin" / "python").exists()
    except OSError:
        return False
