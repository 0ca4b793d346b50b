"""Whose turn it is to take a source's micro-batches, and how a warm run hands over to the next without a gap.

Turns: a run of a source takes batches only once every run of the source created before it has released the
source (`RELEASED_TAG`), ended, or lost its process. That keeps one batch of a source in flight at a time for the
sensor's runs, a launch from the UI and a `dagster job execute` alike, while the next run's process already starts
(Dagster's run-level pool would hold it in the queue instead). Exactly-once does not depend on turns: two runs
taking a batch at once race on its Delta commit, and one of them writes nothing.

Relay: a worker run (`ONCEFLOW_MICRO_BATCH_RUN_S` > 0) says when it means to stop (`UNTIL_TAG`). `RELAY_LEAD_S`
before that, its sensor requests the next run while the source is active; that run starts its process and Spark
session while the first still takes batches, says it is ready (`READY_TAG`) and waits its turn. At its planned
end, a run with a later run of its source alive keeps taking batches until that run is ready (for at most
`HANDOVER_GRACE_S`), then releases the source; the ready run takes the next batch a poll later. A later run that
is not a worker's successor (a launch from the UI or the command line, a retry) is handed over to as soon as it is
ready: each run takes at least one poll, and turns go by creation, so every run gets its turn.

A run killed before its work began holds its source for at most `start_timeout_s` (`run_worker.never_began`); a
run waiting for its turn says which runs it waits for, and again whenever they change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg

from onceflow.jobs.run_worker import PID_TAG, START_TIMEOUT_S, never_began, recorded, worker_gone

UNTIL_TAG, READY_TAG, RELEASED_TAG = "onceflow/until_ms", "onceflow/ready_ms", "onceflow/released_ms"
RELAY_TAG = "onceflow/relay_of"
RELAY_LEAD_S = 30.0
"""How long before a worker run's planned end its successor is requested: its launch, process start and Spark
session take about ten seconds on a loaded machine."""
HANDOVER_GRACE_S = 120.0
"""How long a run past its planned end keeps taking batches for a successor that is not ready yet."""
TURN_POLL_S = 0.2


def _now_ms() -> int:
    return int(time.time() * 1000)


def _stamp(run_id: str, ms: int | None = None) -> str:
    """A tag value naming the run that wrote it: Dagster copies a run's tags to its retry, which must not read its
    parent's."""
    return f"{_now_ms() if ms is None else ms}@{run_id}"


def stamped(run: dg.DagsterRun, tag: str) -> int | None:
    """The epoch ms `run` itself stamped on `tag`, or None."""
    ms, _, writer = run.tags.get(tag, "").partition("@")
    return int(ms) if writer == run.run_id else None


def holds_source(instance: dg.DagsterInstance, run: dg.DagsterRun, start_timeout_s: float = START_TIMEOUT_S) -> bool:
    """Whether `run` may still take batches of its source: not finished, not released, its process not gone, and
    not a run that never began its work within `start_timeout_s`."""
    return (not run.is_finished and stamped(run, RELEASED_TAG) is None and not worker_gone(run.run_id, run.tags)
            and not never_began(instance, run, start_timeout_s))


def _described(run: dg.DagsterRun, start_timeout_s: float) -> str:
    worker = (f"its process {run.tags[PID_TAG]}" if recorded(run)
              else f"not begun: it holds the source for at most {start_timeout_s:.0f}s")
    return f"run {run.run_id} ({run.status.value}, {worker})"


def _runs_around(instance: dg.DagsterInstance, run_id: str, tags: dict[str, str]) -> tuple[list, list]:
    """The records of the source's other runs created before, and after, `run_id`."""
    records = instance.get_run_records(filters=dg.RunsFilter(tags=tags), limit=20)
    mine = next((r for r in records if r.dagster_run.run_id == run_id), None) or instance.get_run_record_by_id(run_id)
    if mine is None:
        return [], []
    others = [r for r in records if r.dagster_run.run_id != run_id]
    return ([r for r in others if r.storage_id < mine.storage_id], [r for r in others if r.storage_id > mine.storage_id])


@dataclass(frozen=True)
class Turn:
    """A run's turn: `waited` for earlier runs of its source; `since_ms`, when the last of them stopped taking
    batches (its release, else the moment the wait ended), or None when it waited for none."""

    waited: bool
    since_ms: int | None


def take_turn(
    instance: dg.DagsterInstance, run_id: str, tags: dict[str, str], warm: Callable[[], None],
    start_timeout_s: float = START_TIMEOUT_S, say: Callable[[str], None] = lambda _: None,
) -> Turn:
    """Wait until no earlier run of the source holds it, saying (`say`) which runs it waits for. Where one does,
    `warm` (the Spark session) first, then say this run is ready, so the earlier one hands over (at its planned end
    to its own successor, at once to any other run; see `keep_going`)."""

    def holding() -> list[dg.DagsterRun]:
        earlier = _runs_around(instance, run_id, tags)[0]
        return [r.dagster_run for r in earlier if holds_source(instance, r.dagster_run, start_timeout_s)]

    earlier = holding()
    if not earlier:
        return Turn(waited=False, since_ms=None)
    warm()
    instance.add_run_tags(run_id, {READY_TAG: _stamp(run_id)})
    said: set[str] = set()
    while earlier:
        if {r.run_id for r in earlier} != said:
            said = {r.run_id for r in earlier}
            say(f"waiting for its turn: {', '.join(_described(r, start_timeout_s) for r in earlier)}")
        time.sleep(TURN_POLL_S)
        earlier = holding()
    released = [stamped(r.dagster_run, RELEASED_TAG) for r in _runs_around(instance, run_id, tags)[0]]
    return Turn(waited=True, since_ms=max([ms for ms in released if ms is not None], default=_now_ms()))


def keep_going(
    instance: dg.DagsterInstance, run_id: str, tags: dict[str, str], until_ms: int,
    start_timeout_s: float = START_TIMEOUT_S,
) -> bool:
    """Whether a worker run takes another batch: not once a later run of the source that is not its own successor
    (a launch from the UI or the command line, a retry) is ready and waiting for it; else before its planned end,
    yes; after it, while a later run of the source is alive but not ready yet, within `HANDOVER_GRACE_S`."""
    later = [r.dagster_run for r in _runs_around(instance, run_id, tags)[1]
             if holds_source(instance, r.dagster_run, start_timeout_s)]
    ready = [run for run in later if stamped(run, READY_TAG) is not None]
    if any(run.tags.get(RELAY_TAG) != run_id for run in ready):
        return False
    now = _now_ms()
    if now < until_ms:
        return True
    return now < until_ms + HANDOVER_GRACE_S * 1000 and bool(later) and not ready


def release(instance: dg.DagsterInstance, run_id: str) -> None:
    """Say this run takes no more batches: the next run of the source may take them."""
    instance.add_run_tags(run_id, {RELEASED_TAG: _stamp(run_id)})


def plan_end(instance: dg.DagsterInstance, run_id: str, run_s: float) -> int:
    """Say when this worker run means to stop taking batches (`run_s` from now); that epoch ms."""
    until = _now_ms() + int(run_s * 1000)
    instance.add_run_tags(run_id, {UNTIL_TAG: _stamp(run_id, until)})
    return until


def due_for_relay(
    instance: dg.DagsterInstance, runs: list[dg.DagsterRun], now_ms: int, start_timeout_s: float = START_TIMEOUT_S
) -> dg.DagsterRun | None:
    """The worker run to request a successor for: the only run of `runs` (a source's newest) holding the source,
    taking batches and within `RELAY_LEAD_S` of its planned end."""
    holding = [run for run in runs if holds_source(instance, run, start_timeout_s)]
    until = stamped(holding[0], UNTIL_TAG) if len(holding) == 1 else None
    return holding[0] if until is not None and now_ms >= until - RELAY_LEAD_S * 1000 else None
