"""A throwaway PostgreSQL server on a loopback port, for Dagster's run storage in tests and the demo.

It uses the Debian `postgresql` package's own binaries (`initdb`, `postgres`, `pg_isready`, `createdb`), which
set-up installs with apt-get when they are missing. Each server has its own temporary data and socket
directories, listens on 127.0.0.1 only on a free port, requires a password over TCP (the one Dagster gets from
the environment, as in production) and runs in its own process group, which `stop` ends. As root it runs as the
`postgres` user, since `initdb` and `postgres` refuse to run as root.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from onceflow.resources.emulators.pubsub import free_port
from onceflow.resources.processes import stop_process_group

POSTGRES_VERSION = "15"
PACKAGE = "postgresql"
BIN_DIR = Path(f"/usr/lib/postgresql/{POSTGRES_VERSION}/bin")


class PostgresUnavailable(RuntimeError):
    """PostgreSQL is not installed and set-up could not install it; the message says how to."""


@dataclass
class PostgresServer:
    """A running server; `env()` is what the production `dagster.yaml` reads its connection from."""

    process: subprocess.Popen[bytes]
    port: int
    password: str
    workdir: Path
    host: str = "127.0.0.1"
    user: str = "onceflow"
    database: str = "dagster"

    @property
    def url(self) -> str:
        """An SQLAlchemy URL with the driver Dagster's storage needs (see deploy/dagster.prod.yaml)."""
        return f"postgresql+psycopg2://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    @property
    def dsn(self) -> str:
        """A libpq URL of the database, as psycopg (and `PostgresSink`) takes it."""
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.database,
        }

    def log(self, chars: int = 3000) -> str:
        return (self.workdir / "postgres.log").read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        # SIGINT is PostgreSQL's fast shutdown (it ends every session); SIGKILL ends a group that ignored it.
        stop_process_group(self.process, (signal.SIGINT, signal.SIGKILL), timeout_s=15)
        shutil.rmtree(self.workdir, ignore_errors=True)


def ensure_postgres() -> Path:
    """The PostgreSQL binaries' directory, installing the Debian package first when it is missing."""
    if (BIN_DIR / "initdb").exists():
        return BIN_DIR
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise PostgresUnavailable(
            f"PostgreSQL {POSTGRES_VERSION} is not installed ({BIN_DIR}/initdb is missing) and set-up cannot install "
            f"it here: run `sudo apt-get install -y {PACKAGE}` (Debian 12), or point Dagster at an existing server"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", PACKAGE]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PostgresUnavailable(f"`{' '.join(command)}` failed: {done.stderr[-2000:]}")
    if not (BIN_DIR / "initdb").exists():
        raise PostgresUnavailable(f"`apt-get install {PACKAGE}` did not install {BIN_DIR}/initdb")
    return BIN_DIR


def start_postgres(timeout_s: float = 60.0) -> PostgresServer:
    """Initialise a new cluster in a temporary directory and start it on 127.0.0.1 on a free port, with the
    database `dagster` owned by the user `onceflow` (a random password)."""
    bin_dir = ensure_postgres()
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-postgres-"))
    data, sockets = workdir / "data", workdir / "sockets"
    sockets.mkdir()
    password = secrets.token_hex(16)
    (workdir / "password").write_text(password)
    owner = _owner()
    if owner is not None:
        for path in (workdir, sockets, workdir / "password"):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    as_owner = _as_user(owner)
    server: PostgresServer | None = None
    try:
        _run(as_owner, bin_dir / "initdb", "-D", str(data), "-U", "onceflow", f"--pwfile={workdir / 'password'}",
             "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync")
        port = free_port()
        with (workdir / "postgres.log").open("wb") as log:
            process = subprocess.Popen(
                [*as_owner, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets),
                 "-c", "listen_addresses=127.0.0.1",
                 # A throwaway server: nothing needs to survive a machine crash, and fsync only slows tests down.
                 "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
            )
        server = PostgresServer(process, port, password, workdir)
        _wait_ready(server, bin_dir, sockets, timeout_s)
        _run(as_owner, bin_dir / "createdb", "-h", str(sockets), "-p", str(port), "-U", "onceflow", server.database)
        return server
    except BaseException:
        if server is not None:
            server.stop()
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        raise


def _owner() -> pwd.struct_passwd | None:
    """The account the server runs as when this process is root (PostgreSQL refuses root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root, PostgreSQL needs the `postgres` account its Debian package creates: "
            f"`apt-get install --reinstall {PACKAGE}`"
        ) from None


def _as_user(owner: pwd.struct_passwd | None) -> list[str]:
    """The command prefix that runs a program as `owner`.

    `setpriv` drops the privileges rather than subprocess's `user=`: with `user=`, Python forks instead of
    vfork-ing, and a fork runs the fork handlers of gRPC's threads (Pub/Sub clients) in the child, which can fail
    the child before it runs anything.
    """
    if owner is None:
        return []
    return ["setpriv", f"--reuid={owner.pw_uid}", f"--regid={owner.pw_gid}", "--clear-groups", "--"]


def _run(as_owner: list[str], program: Path, *args: str) -> None:
    done = subprocess.run([*as_owner, str(program), *args], capture_output=True, text=True, check=False, cwd="/")
    if done.returncode != 0:
        output = f"{done.stdout}\n{done.stderr}".strip()[-2000:]
        raise RuntimeError(f"`{program.name}` exited with {done.returncode}: {output}")


def _wait_ready(server: PostgresServer, bin_dir: Path, sockets: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited: {server.log()}")
        ready = subprocess.run([str(bin_dir / "pg_isready"), "-q", "-h", str(sockets), "-p", str(server.port)],
                               check=False)
        if ready.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"PostgreSQL did not accept connections on port {server.port} within {timeout_s:.0f}s")
