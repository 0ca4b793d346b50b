"""`WarmRunLauncher`: Dagster's default run launcher, with a process kept warm for the runs to come.

Dagster's default launcher asks the code location's server to start a run; the server spawns a fresh Python
process, which imports Dagster and onceflow (3 s of CPU on this 2-core machine) before it loads the definitions
and runs the first step. This launcher keeps one standby process per code location (`standby_run`) that has done
those imports once, and has it fork a process for each run of that location. The forked process loads the
definitions and executes the run exactly as `dagster api execute_run` does: the run starts within a second of its
dequeue, no other process imports beside it while its first batch works, and nothing of the exactly-once path
changes.

- A run runs the code on disk at launch, as a spawned process does. Its process loads the definitions afresh, and
  if a module the standby imported has changed on disk since, the standby stands down, the run launches the
  default way, and a new standby imports the new code.
- The first run of a code location after the launching process (the daemon) starts launches the default way: a
  standby is started once the launcher knows the location's Python and working directory, at its first launch.
- A forked run is tagged with its process (`run_worker.worker_tags`): if it dies before the run reports,
  `dead_run_sensor` reports the run failed. `terminate` interrupts that process (SIGINT: Dagster cancels the run,
  as when the code server's termination event fires).
- Anything unexpected (a standby that died, or that is not ready within `READY_WAIT_S`) falls back to the default
  launch, and the run's log says why.
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
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import RepositoryPythonOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClassData, serialize_value

from onceflow.jobs.run_worker import PID_STARTED_TAG, PID_TAG, worker_tags
from onceflow.orchestration import standby_run

LAUNCHED_BY_TAG = "onceflow/launched_by"
READY_WAIT_S = 10.0
"""How long a launch waits for a standby still importing (a fresh spawn takes as long)."""
STARTED_WAIT_S = 30.0


@dataclass
class Standby:
    """A `standby_run` process for one code location."""

    origin: RepositoryPythonOrigin
    process: subprocess.Popen[str]
    ready: bool = False

    @classmethod
    def start(cls, origin: RepositoryPythonOrigin, instance_ref: InstanceRef) -> Standby:
        """Start a standby for `origin`'s runs on the instance `instance_ref` describes. It is given the modules of
        the instance's configured classes (storage, launcher, ...), never their config: that may hold secrets."""
        working_directory = getattr(origin.code_pointer, "working_directory", None)
        modules = sorted({c.module_name for c in instance_ref._asdict().values() if isinstance(c, ConfigurableClassData)})
        process = subprocess.Popen(
            [origin.executable_path or sys.executable, "-m", standby_run.__name__, *modules],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=working_directory or None,
        )
        return cls(origin, process)

    def await_ready(self, timeout_s: float) -> bool:
        """Whether the standby has imported what runs import (waiting up to `timeout_s` for it)."""
        if not self.ready and self.process.poll() is None:
            self.ready = _reply(self.process.stdout, timeout_s) == standby_run.READY
        return self.ready and self.process.poll() is None

    def fork(self, args: ExecuteRunArgs) -> tuple[int, float] | None:
        """Have the standby fork a process that executes `args`' run: that process's pid and start time, or None if
        the standby's code is stale (it ended). Raises `DagsterLaunchFailedError` if it says neither."""
        try:
            self.process.stdin.write(serialize_value(args) + "\n")  # type: ignore[union-attr]  # stdin=PIPE
            self.process.stdin.flush()  # type: ignore[union-attr]
        except OSError as error:
            self.stop()
            raise DagsterLaunchFailedError(f"the standby run process {self.process.pid} is gone: {error}") from error
        reply = (_reply(self.process.stdout, STARTED_WAIT_S) or "").split()
        if reply == [standby_run.STALE]:
            self.stop()
            return None
        if len(reply) == 3 and reply[0] == standby_run.STARTED:
            return int(reply[1]), float(reply[2])
        self.stop()
        raise DagsterLaunchFailedError(f"the standby run process {self.process.pid} did not start run {args.run_id} "
                                       f"within {STARTED_WAIT_S:.0f} s")

    def stop(self) -> None:
        """End the standby (the runs it forked run on)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def _reply(stream: IO[str] | None, timeout_s: float) -> str | None:
    if stream is None or not select.select([stream], [], [], timeout_s)[0]:
        return None
    return stream.readline().strip() or None


class WarmRunLauncher(dg.DefaultRunLauncher):
    """Launches runs in processes forked from one that has imported what they import (see the module docstring)."""

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
            standby, why_not = self._standby(location, origin)
            try:
                if standby is not None:
                    why_not = self._fork(run, standby)
                if why_not:
                    self._instance.report_engine_event(f"Launching the default way: {why_not}.", run,
                                                       cls=self.__class__)
                    super().launch_run(context)
            finally:
                if standby is not None and standby.process.returncode is not None:
                    del self._standbys[location]  # it ended: stale, or failed to fork
                if location not in self._standbys:
                    self._standbys[location] = Standby.start(origin, self._instance.get_ref())

    def _fork(self, run: dg.DagsterRun, standby: Standby) -> str:
        """Have `standby` fork `run`'s process; why not, if it did not."""
        args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=self._instance.get_ref())
        forked = standby.fork(args)
        if forked is None:
            return f"a module the standby process {standby.process.pid} imported has changed on disk since"
        pid, started = forked
        self._instance.add_run_tags(run.run_id, {**worker_tags(run.run_id, pid, started), LAUNCHED_BY_TAG: "standby"})
        self._instance.report_engine_event(
            f"Launched in process {pid}, forked from standby process {standby.process.pid}, which had imported "
            "what runs import.", run, cls=self.__class__)
        self._run_ids.add(run.run_id)
        return ""

    def _standby(self, location: str, origin: RepositoryPythonOrigin) -> tuple[Standby | None, str]:
        """The standby for this launch, or None and why not (a standby that cannot serve it is stopped)."""
        standby = self._standbys.get(location)
        if standby is None:
            return None, "no standby process yet (the launcher's first run of this code location)"
        pid = standby.process.pid
        if standby.origin != origin:
            why_not = "the code location's origin changed since the standby process started"
        elif standby.await_ready(READY_WAIT_S):
            return standby, ""
        elif standby.process.poll() is not None:
            why_not = f"the standby process {pid} ended (exit code {standby.process.returncode})"
        else:
            why_not = f"the standby process {pid} did not import within {READY_WAIT_S} s"
        del self._standbys[location]
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
