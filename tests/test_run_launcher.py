"""`WarmRunLauncher` on a real instance and a real code server: after its first launch, a run executes in a process
forked from a standby process that had imported what runs import before the run was launched, and the same
standby forks the runs after it; the forked run loads the definitions itself; a standby whose code changed on disk
since, or a dead one, is never used (the default launch instead); terminating a forked run cancels it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import psutil
import pytest
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import PythonFileTarget

from onceflow.jobs.run_worker import PID_TAG
from onceflow.orchestration import standby_run
from onceflow.orchestration.run_launcher import LAUNCHED_BY_TAG
from onceflow.orchestration.sensors.runs import run_worker_pid
from tests import launcher_code, launcher_instance, launcher_threads_code

LOCATION = "launcher_code"
WARM = {"run_launcher": {"module": launcher_instance.__name__, "class": launcher_instance.TestsWarmRunLauncher.__name__}}


@dataclass
class Workspace:
    """A code location's definitions, served by a real code server to a real instance with the warm launcher."""

    context: WorkspaceProcessContext
    defs: dg.Definitions

    @property
    def instance(self) -> dg.DagsterInstance:
        return self.context.instance


@pytest.fixture(params=[launcher_code])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workspace]:
    with dg.instance_for_test(overrides=WARM, temp_dir=str(tmp_path)) as instance:
        target = PythonFileTarget(python_file=request.param.__file__, attribute="defs",
                                  working_directory=str(Path(launcher_code.__file__).parent.parent),
                                  location_name=LOCATION)
        with WorkspaceProcessContext(instance, target) as context:
            yield Workspace(context, request.param.defs)


def launch(workspace: Workspace, job_name: str) -> str:
    """Create and launch a run of `job_name` as the daemon launches a dequeued run."""
    request = workspace.context.create_request_context()
    remote = request.get_code_location(LOCATION).get_repository("__repository__").get_full_job(job_name)
    run = workspace.instance.create_run_for_job(
        job_def=workspace.defs.resolve_job_def(job_name), remote_job_origin=remote.get_remote_origin(),
        job_code_origin=remote.get_python_origin())
    workspace.instance.launch_run(run.run_id, request)
    return run.run_id


def finished(instance: dg.DagsterInstance, run_id: str, timeout_s: float = 120.0) -> dg.DagsterRun:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.is_finished:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} did not finish within {timeout_s} s")


def launched(instance: dg.DagsterInstance, run_id: str) -> str:
    """What the launcher said of how it launched the run."""
    said = f"[{launcher_instance.TestsWarmRunLauncher.__name__}] "
    return next(e.message.removeprefix(said) for e in instance.all_logs(run_id) if e.message.startswith(said))


def standbys() -> set[int]:
    """This process's standby run processes (the launcher is in this process)."""
    found = set()
    for child in psutil.Process().children():
        try:
            if standby_run.__name__ in " ".join(child.cmdline()):
                found.add(child.pid)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass  # a standby that ran its run and ended
    return found


def await_standby(timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(found := standbys()) == 1:
            return found.pop()
        time.sleep(0.2)
    raise AssertionError(f"expected one standby run process, found {standbys()}")


def test_runs_after_the_first_execute_in_processes_forked_from_one_standby(workspace):
    instance = workspace.instance
    first = finished(instance, launch(workspace, "quick"))
    assert first.status == dg.DagsterRunStatus.SUCCESS
    assert LAUNCHED_BY_TAG not in first.tags  # nothing was warm yet: the code server's spawned process ran it
    assert launched(instance, first.run_id) == ("Launching the default way: no standby process yet (the launcher's "
                                                "first run of this code location).")
    standby = await_standby()
    forked = set()
    for _ in range(2):
        run = finished(instance, launch(workspace, "quick"))
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags[LAUNCHED_BY_TAG] == "standby"
        pid = run_worker_pid(instance, run.run_id)
        assert pid == int(run.tags[PID_TAG]) not in (standby, run_worker_pid(instance, first.run_id))
        assert launched(instance, run.run_id) == (f"Launched in process {pid}, forked from standby process {standby}, "
                                                  "which had imported what runs import.")
        forked.add(pid)
    assert len(forked) == 2  # a process per run
    assert await_standby() == standby  # one standby serves them all: nothing imports again per run


def test_a_standby_whose_code_changed_on_disk_or_that_died_is_not_used(workspace):
    instance = workspace.instance
    finished(instance, launch(workspace, "quick"))
    stale = await_standby()
    assert instance.run_launcher._standbys[LOCATION].await_ready(60)  # it has imported and noted the files' times
    imported = Path(launcher_instance.__file__)  # a module this instance's standby imports, and only it
    times = imported.stat()
    os.utime(imported)  # changed on disk since the standby imported it
    try:
        after_change = finished(instance, launch(workspace, "quick"))
    finally:
        os.utime(imported, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert after_change.status == dg.DagsterRunStatus.SUCCESS
    assert LAUNCHED_BY_TAG not in after_change.tags
    assert launched(instance, after_change.run_id) == (
        f"Launching the default way: a module the standby process {stale} imported has changed on disk since.")
    assert not psutil.pid_exists(stale)
    dead = await_standby()
    psutil.Process(dead).kill()
    after_death = finished(instance, launch(workspace, "quick"))
    assert after_death.status == dg.DagsterRunStatus.SUCCESS
    assert LAUNCHED_BY_TAG not in after_death.tags
    assert f"the standby process {dead} ended (exit code -9)" in launched(instance, after_death.run_id)
    warm = finished(instance, launch(workspace, "quick"))
    assert warm.tags[LAUNCHED_BY_TAG] == "standby"


def test_terminating_a_run_in_a_standby_cancels_it(workspace):
    instance = workspace.instance
    finished(instance, launch(workspace, "quick"))
    standby = await_standby()
    run_id = launch(workspace, "waits")
    deadline = time.monotonic() + 60
    while instance.get_run_by_id(run_id).status != dg.DagsterRunStatus.STARTED and time.monotonic() < deadline:
        time.sleep(0.2)
    run = instance.get_run_by_id(run_id)
    assert run.tags[LAUNCHED_BY_TAG] == "standby"
    forked = psutil.Process(int(run.tags[PID_TAG]))
    assert forked.ppid() == standby
    assert instance.run_launcher.terminate(run_id)
    assert finished(instance, run_id, timeout_s=60).status == dg.DagsterRunStatus.CANCELED
    forked.wait(timeout=30)
    assert await_standby() == standby  # the standby serves on


@pytest.mark.parametrize("workspace", [launcher_threads_code], indirect=True)
def test_a_forked_run_loads_the_definitions_in_its_own_process(workspace):
    """What loading the definitions starts (here a thread) exists in the run's process: it is not forked."""
    instance = workspace.instance
    finished(instance, launch(workspace, "quick"))
    await_standby()
    run = finished(instance, launch(workspace, "quick"))
    assert run.tags[LAUNCHED_BY_TAG] == "standby"
    assert run.status == dg.DagsterRunStatus.SUCCESS
