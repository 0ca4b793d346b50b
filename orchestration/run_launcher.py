"""`WarmRunLauncher`: Dagster's default run launcher, with a process kept warm for the next run.

Dagster's default launcher asks the code location's server to start a run; the server spawns a fresh Python
process, which imports Dagster and the definitions before the run's first step: 2-4 s of a micro-batch run's first
batch on 2 cores. This launcher keeps one standby process per code location (`standby_run`) that has done that
already, hands it the next run of that location, and starts the next standby at once. The run then executes in the
standby exactly as `dagster api execute_run` executes it; nothing of the exactly-once path changes.

- A standby runs the code on disk at launch, as a spawned process does: if a Python module it loaded has changed
  since, it stands down and the run launches the default way. (A non-Python file read while loading, such as a
  `dg` project's `defs.yaml`, is not watched: every launch starts a fresh standby, so at most the first run after
  such a change runs the definitions from before it.)
- The first run of a code location after the launching process (the daemon) starts launches the default way: a
  standby is started once the launcher knows which definitions to load, at its first launch.
- A run handed to a standby is tagged with its process (`run_worker.worker_tags`): if the standby dies before the
  run reports, `dead_run_sensor` reports the run failed. `terminate` interrupts that process (SIGINT: Dagster
  cancels the run, as when the code server's termination event fires).
- Anything unexpected (a standby that died, or is not ready within `READY_WAIT_S`) falls back to the default launch,
  and the run's log says why.
"""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO

import dagster as dg
import psutil
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import RepositoryPythonOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClassData, serialize_value

from onceflow.jobs.run_worker import PID_STARTED_TAG, PID_TAG, worker_tags
from onceflow.orchestration import standby_run

LAUNCHED_BY_TAG = "onceflow/launched_by"
READY_WAIT_S = 10.0
"""How long a launch waits for a standby still loading the definitions (a fresh spawn takes as long)."""
STARTED_WAIT_S = 30.0


@dataclass
class Standby:
    """A `standby_run` process for one code location."""

    origin: RepositoryPythonOrigin
    process: subprocess.Popen[str]
    ready: bool = False

    @classmethod
    def start(cls, origin: RepositoryPythonOrigin) -> Standby:
        working_directory = getattr(origin.code_pointer, "working_directory", None)
        process = subprocess.Popen(
            [origin.executable_path or sys.executable, "-m", standby_run.__name__, serialize_value(origin)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=working_directory or None,
        )
        return cls(origin, process)

    def await_ready(self, timeout_s: float) -> bool:
        """Whether the standby has loaded the definitions (waiting up to `timeout_s` for it)."""
        if not self.ready and self.process.poll() is None:
            self.ready = _reply(self.process.stdout, timeout_s) == standby_run.READY
        return self.ready and self.process.poll() is None

    def hand(self, args: ExecuteRunArgs) -> bool:
        """Give the standby its run: whether it started it (False: its code is stale, it ended). Raises
        `DagsterLaunchFailedError` if it says neither."""
        try:
            self.process.stdin.write(serialize_value(args) + "\n")  # type: ignore[union-attr]  # stdin=PIPE
            self.process.stdin.close()  # type: ignore[union-attr]
        except OSError as error:
            raise DagsterLaunchFailedError(f"the standby run process {self.process.pid} is gone: {error}") from error
        reply = _reply(self.process.stdout, STARTED_WAIT_S)
        self.process.stdout.close()  # type: ignore[union-attr]  # it says nothing more
        if reply not in (standby_run.STARTED, standby_run.STALE):
            self.stop()
            raise DagsterLaunchFailedError(f"the standby run process {self.process.pid} did not start run "
                                           f"{args.run_id} within {STARTED_WAIT_S:.0f} s")
        return reply == standby_run.STARTED

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _reply(stream: IO[str] | None, timeout_s: float) -> str | None:
    if stream is None or not select.select([stream], [], [], timeout_s)[0]:
        return None
    return stream.readline().strip() or None


class WarmRunLauncher(dg.DefaultRunLauncher):
    """Launches runs in a process that has loaded their definitions already (see the module docstring)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None):
        super().__init__(inst_data=inst_data)
        self._lock = threading.Lock()
        self._standbys: dict[str, Standby] = {}

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if run.job_code_origin is None or run.remote_job_origin is None:
            super().launch_run(context)
            return
        origin = run.job_code_origin.repository_origin
        location = run.remote_job_origin.repository_origin.code_location_origin.location_name
        with self._lock:
            standby, why_not = self._take(location, origin)
            try:
                if standby is not None:
                    why_not = self._hand(run, standby)
                if why_not:
                    self._instance.report_engine_event(f"Launching the default way: {why_not}.", run,
                                                       cls=self.__class__)
                    super().launch_run(context)
            finally:
                self._standbys[location] = Standby.start(origin)

    def _hand(self, run: dg.DagsterRun, standby: Standby) -> str:
        """Hand `run` to `standby`; why not, if it did not take it."""
        args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=self._instance.get_ref())
        pid = standby.process.pid
        if not standby.hand(args):
            standby.stop()
            return f"a module the standby process {pid} loaded has changed on disk since"
        self._instance.add_run_tags(run.run_id, {**worker_tags(run.run_id, pid), LAUNCHED_BY_TAG: "standby"})
        self._instance.report_engine_event(f"Launched in standby process {pid}, which had loaded the definitions.",
                                           run, cls=self.__class__)
        threading.Thread(target=standby.process.wait, daemon=True).start()  # reaped when it ends
        self._run_ids.add(run.run_id)
        return ""

    def _take(self, location: str, origin: RepositoryPythonOrigin) -> tuple[Standby | None, str]:
        """The standby for this launch, or None and why not."""
        standby = self._standbys.pop(location, None)
        if standby is None:
            return None, "no standby process yet (the launcher's first run of this code location)"
        if standby.origin != origin:
            why_not = "the code location's origin changed since the standby process started"
        elif not standby.await_ready(READY_WAIT_S):
            why_not = (f"the standby process {standby.process.pid} ended (exit code {standby.process.returncode})"
                       if standby.process.poll() is not None else
                       f"the standby process {standby.process.pid} did not load the definitions within {READY_WAIT_S} s")
        else:
            return standby, ""
        standby.stop()
        return None, why_not

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or run.is_finished or LAUNCHED_BY_TAG not in run.tags:
            return super().terminate(run_id)
        self._instance.report_run_canceling(run)
        try:
            process = psutil.Process(int(run.tags[PID_TAG]))
            if abs(process.create_time() - float(run.tags[PID_STARTED_TAG])) > 1.0:
                return False  # the pid was reused: the run's process is gone
            process.send_signal(signal.SIGINT)
        except psutil.NoSuchProcess:
            return False
        return True

    def dispose(self) -> None:
        with self._lock:
            for standby in self._standbys.values():
                standby.stop()
            self._standbys.clear()
