"""Turns and relays of a source's runs (`onceflow.jobs.run_relay`), on a real (temporary) Dagster instance.

`tests/test_ingest_files.py` hands over between two real `dagster job execute` runs; the chaos harness and the
demo relay worker runs under the daemon.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

from onceflow.jobs.run_relay import (
    HANDOVER_GRACE_S,
    READY_TAG,
    RELAY_TAG,
    RELEASED_TAG,
    UNTIL_TAG,
    due_for_relay,
    holds_source,
    keep_going,
    plan_end,
    release,
    stamped,
    take_turn,
)
from onceflow.jobs.run_worker import worker_tags

SOURCE = {"onceflow/source": "events/pubsub"}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def started(instance: dg.DagsterInstance, pid: int | None = None, **tags: str) -> dg.DagsterRun:
    """A STARTED run of the source whose worker is process `pid` (this one by default)."""
    run = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.STARTED,
                              tags={**SOURCE, **tags})
    instance.add_run_tags(run.run_id, worker_tags(run.run_id, pid or os.getpid()))
    return instance.get_run_by_id(run.run_id)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_run_waits_its_turn_warm_and_ready_then_starts_when_the_earlier_run_releases(
    instance: dg.DagsterInstance,
) -> None:
    earlier = started(instance)
    later = started(instance)
    warmed: list[bool] = []
    turn: list = []
    waiting = threading.Thread(target=lambda: turn.append(
        take_turn(instance, later.run_id, SOURCE, warm=lambda: warmed.append(True))))
    waiting.start()
    time.sleep(1.5)
    assert waiting.is_alive() and warmed == [True]  # warm, and waiting
    assert stamped(instance.get_run_by_id(later.run_id), READY_TAG) is not None
    release(instance, earlier.run_id)
    waiting.join(timeout=10)
    released = stamped(instance.get_run_by_id(earlier.run_id), RELEASED_TAG)
    assert turn[0].waited and turn[0].since_ms == released
    # The first run of a source waits for nothing and warms nothing (its first batch starts Spark if it has one).
    assert take_turn(instance, earlier.run_id, SOURCE, warm=lambda: warmed.append(False)).since_ms is None
    assert warmed == [True]


def test_a_dead_or_finished_run_holds_no_turn_and_a_retry_does_not_read_its_parents_stamps(
    instance: dg.DagsterInstance,
) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = started(instance, pid=worker.pid)
    assert holds_source(instance, dead)
    worker.kill()
    worker.wait()
    assert not holds_source(instance, dead)  # killed without a word to Dagster: it still says STARTED
    finished = started(instance)
    instance.report_run_failed(finished)
    assert not holds_source(instance, instance.get_run_by_id(finished.run_id))
    assert take_turn(instance, started(instance).run_id, SOURCE, warm=lambda: None).waited is False

    parent = started(instance)
    release(instance, parent.run_id)
    retry = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.NOT_STARTED,
                                tags=instance.get_run_by_id(parent.run_id).tags)  # Dagster copies the tags
    assert not holds_source(instance, instance.get_run_by_id(parent.run_id))
    assert holds_source(instance, retry) and stamped(retry, RELEASED_TAG) is None


def test_a_worker_run_keeps_going_past_its_end_only_for_a_successor_still_starting(
    instance: dg.DagsterInstance,
) -> None:
    run = started(instance)
    until = plan_end(instance, run.run_id, 60)
    assert stamped(instance.get_run_by_id(run.run_id), UNTIL_TAG) == until
    assert keep_going(instance, run.run_id, SOURCE, until)  # before its planned end
    ended = now_ms() - 1
    assert not keep_going(instance, run.run_id, SOURCE, ended)  # no successor: stop
    successor = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.NOT_STARTED,
                                    tags=SOURCE)
    assert keep_going(instance, run.run_id, SOURCE, ended)  # one is starting: go on taking batches
    assert not keep_going(instance, run.run_id, SOURCE, now_ms() - int(HANDOVER_GRACE_S * 1000) - 1)
    instance.add_run_tags(successor.run_id, worker_tags(successor.run_id, os.getpid()))
    instance.add_run_tags(successor.run_id, {READY_TAG: f"{now_ms()}@{successor.run_id}"})
    assert not keep_going(instance, run.run_id, SOURCE, ended)  # it is ready: hand over
    # Before its end, a worker hands over only to a ready run that is not its own successor (a UI launch, a retry).
    assert not keep_going(instance, run.run_id, SOURCE, until)
    instance.add_run_tags(successor.run_id, {RELAY_TAG: run.run_id})
    assert keep_going(instance, run.run_id, SOURCE, until)


def test_only_a_lone_worker_near_its_planned_end_is_due_for_relay(instance: dg.DagsterInstance) -> None:
    run = started(instance)
    assert due_for_relay(instance, [run], now_ms()) is None  # not a worker run (no planned end)
    until = plan_end(instance, run.run_id, 60)
    run = instance.get_run_by_id(run.run_id)
    assert due_for_relay(instance, [run], now_ms()) is None  # 60 s off
    assert due_for_relay(instance, [run], until - 10_000) == run
    successor = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.NOT_STARTED,
                                    tags=SOURCE)
    assert due_for_relay(instance, [successor, run], until - 10_000) is None  # its successor is on its way
    # A retry carrying the worker's copied planned end is not a worker of its own.
    copy = create_run_for_test(instance, job_name="ingest_events", status=dg.DagsterRunStatus.NOT_STARTED,
                               tags={**SOURCE, UNTIL_TAG: run.tags[UNTIL_TAG]})
    assert due_for_relay(instance, [copy], until) is None
