"""The chaos harness's faults of operators and producers, beside the crashes of `tests.chaos.faults`: a run killed in
its first second, a declaration changed between two attempts of a batch, and, with `events` on Kafka, its topic
re-created under its name, a transaction held open past the idle time, a partition of only malformed records.

Records a fault sends itself are recorded as what the end state must hold (`Extra`): valid ones in raw, malformed
ones in the dead letters, and `either` ones (valid under one release of the declaration, dead letters under the
next) in exactly one of the two.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from confluent_kafka import Producer

from onceflow.orchestration.local_stack import PROJECT_ROOT, LocalStack
from onceflow.orchestration.workload import Publisher
from onceflow.resources.faults import CRASH_EXIT_CODE
from onceflow.resources.kafka import KafkaClient

ORDERS_TOPIC = "onceflow-orders"
EVENTS_TOPIC = "onceflow-events"
SMALL_RECORDS = 1024
"""The next release's `max_record_bytes` for `orders` (`CHAOS_ORDERS_MAX_RECORD_BYTES`): a marker order is over it."""


@dataclass
class Extra:
    """What a pipeline's faults sent themselves: record IDs by where they must end."""

    valid: set[str] = field(default_factory=set)
    malformed: set[str] = field(default_factory=set)
    either: set[str] = field(default_factory=set)


class OperatorFaults:
    """Mixed into `tests.chaos.faults.FaultInjector` (which gives `stack`, `rng`, `log`, `_dagster_env` and
    `events`, the events publisher)."""

    stack: LocalStack
    events: Publisher | None
    extra: dict[str, Extra]

    def first_second(self) -> bool:
        """A `dagster job execute` SIGKILLed, its whole process group, the moment its run is in the instance."""
        pipeline = self.rng.choice(["events", "orders"])
        known = set(self.stack.instance.get_run_ids(limit=50))
        cli = subprocess.Popen(self._dagster(["job", "execute", "-m", "onceflow.orchestration.definitions",
                                              "-j", f"ingest_{pipeline}"]), cwd=PROJECT_ROOT, env=self._dagster_env(),
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while cli.poll() is None and time.monotonic() < deadline:
            if set(self.stack.instance.get_run_ids(limit=50)) - known:
                break
            time.sleep(0.01)
        os.killpg(cli.pid, signal.SIGKILL)
        cli.wait()
        self.log.note("first_second", f"`dagster job execute -j ingest_{pipeline}` killed as its run was created")
        return True

    def declaration_change(self) -> bool:
        """A batch of `orders` killed between its two commits under one release of the declaration, and its next
        attempt under the next release, in which the batch's marker orders (valid before) are oversized."""
        markers = [f"marker-{time.time_ns()}-{i}" for i in range(3)]
        now_ms = int(time.time() * 1000)
        note = "x" * (SMALL_RECORDS * 2)
        messages = [(json.dumps({"customer": "c0", "region": "eu", "amount": 1.5, "note": note}).encode(),
                     {"order_id": marker, "ts": str(now_ms)}) for marker in markers]
        self.stack_pubsub().publish(ORDERS_TOPIC, messages)
        self.extra.setdefault("orders", Extra()).either.update(markers)
        job = ["job", "execute", "-m", "onceflow.orchestration.definitions", "-j", "ingest_orders"]
        first = subprocess.run(self._dagster(job), cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                               env={**self._dagster_env(), "ONCEFLOW_CRASH_AT": "ingest.after_dead_letters"})
        if first.returncode != CRASH_EXIT_CODE:
            return False
        second = subprocess.run(self._dagster(job), cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                                env={**self._dagster_env(), "CHAOS_ORDERS_MAX_RECORD_BYTES": str(SMALL_RECORDS)})
        self.log.note("declaration_change", f"an orders batch killed between its commits, its next attempt under a "
                      f"declaration with max_record_bytes={SMALL_RECORDS}: exit {second.returncode}")
        return True

    def topic_recreated(self) -> bool:
        """`events`'s topic deleted and created again under its name once the source has caught up (the publisher
        held meanwhile), then `onceflow reset events`, the documented way out."""
        if self.stack.kafka is None or self.events is None:
            return False
        self.events.held.set()
        try:
            client = KafkaClient(self.stack.kafka.bootstrap)
            self._caught_up("events")
            partitions = len(client.partitions(EVENTS_TOPIC))
            admin = self.stack.kafka.admin()
            admin.delete_topics([EVENTS_TOPIC])[EVENTS_TOPIC].result(30)
            deadline = time.monotonic() + 60
            while True:
                try:
                    self.stack.kafka.create_topic(EVENTS_TOPIC, partitions=partitions)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            reset = self._until_reset("events")
        finally:
            self.events.held.clear()
        self.log.note("topic_recreated", f"{EVENTS_TOPIC} re-created; `onceflow reset events`: {reset}")
        return True

    def transaction_open(self) -> bool:
        """Valid events in a transaction held open past the idle time on one partition, then committed."""
        if self.stack.kafka is None:
            return False
        producer = Producer({"bootstrap.servers": self.stack.kafka.bootstrap,
                             "transactional.id": f"chaos-{time.time_ns()}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        ids = [f"txn-{time.time_ns()}-{i}" for i in range(20)]
        now_ms = int(time.time() * 1000)
        for i, event_id in enumerate(ids):
            producer.produce(EVENTS_TOPIC, value=json.dumps({"key": f"k{i % 8}", "value": i}).encode(), partition=0,
                             key=event_id.encode(), timestamp=now_ms - i,
                             headers=[("event_id", event_id.encode()), ("event_time", str(now_ms - i).encode())])
        producer.flush(30)
        time.sleep(self.idle_s() + 5)
        producer.commit_transaction(30)
        self.extra.setdefault("events", Extra()).valid.update(ids)
        self.log.note("transaction_open", f"20 events in a transaction held open {self.idle_s() + 5}s on partition 0")
        return True

    def malformed_partition(self) -> bool:
        """One partition brings nothing but lines that are not JSON, for longer than the idle time."""
        if self.stack.kafka is None:
            return False
        producer = Producer({"bootstrap.servers": self.stack.kafka.bootstrap})
        ids, deadline = [], time.monotonic() + self.idle_s() + 5
        while time.monotonic() < deadline:
            event_id = f"junk-{time.time_ns()}"
            producer.produce(EVENTS_TOPIC, value=b"not json {", partition=2, key=event_id.encode(),
                             headers=[("event_id", event_id.encode())])
            ids.append(event_id)
            producer.flush(30)
            time.sleep(0.5)
        self.extra.setdefault("events", Extra()).malformed.update(ids)
        self.log.note("malformed_partition", f"{len(ids)} lines that are not JSON on partition 2 alone")
        return True

    def idle_s(self) -> float:
        return float(self._dagster_env().get("ONCEFLOW_WATERMARK_IDLE_S", "120"))

    def _caught_up(self, pipeline: str, timeout_s: float = 180) -> None:
        """Wait until the pipeline's source has nothing left to take."""
        from onceflow.jobs.sources.reader import open_source
        from onceflow.orchestration.pipelines import load_pipelines
        from onceflow.resources.settings import load_settings

        declared = next(p for p in load_pipelines(load_settings()) if p.name == pipeline)
        source, deadline = open_source(declared, self.stack.lake), time.monotonic() + timeout_s
        while source.reader.has_data(source.checkpoints.load()) and time.monotonic() < deadline:
            time.sleep(1)

    def _until_reset(self, pipeline: str, timeout_s: float = 180) -> str:
        """`onceflow reset <pipeline>`, again while a run of it is in flight (the runs the sensor starts on the
        changed log fail, naming it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = subprocess.run(self._onceflow(["reset", pipeline]), cwd=PROJECT_ROOT, capture_output=True,
                                  text=True, timeout=300, env=self._dagster_env())
            if done.returncode == 0 or time.monotonic() > deadline:
                return (done.stdout + done.stderr).strip().splitlines()[-1] if done.stdout + done.stderr else ""
            time.sleep(2)

    def stack_pubsub(self):
        from onceflow.orchestration.deployments import PUBSUB, resources_for
        from onceflow.resources.settings import load_settings

        return resources_for(load_settings())[PUBSUB].client()
