"""`KafkaSink` on a real KRaft broker (no Spark): a writer killed in the middle of its transaction is fenced by
the next writer of its output, whose consumers (`read_committed`) see each record once; writing a commit again
changes nothing; the markers say which commits the topic holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from onceflow import Commit, KafkaSink
from onceflow.resources.emulators.kafka import KafkaBroker
from tests.pauses import wait_paused

WRITER = textwrap.dedent("""
    import sys
    import pyarrow as pa
    from onceflow import Commit, KafkaSink
    sink = KafkaSink(bootstrap_servers=sys.argv[1], topic=sys.argv[2], key="order_id")
    rows = pa.table({"record_id": ["a", "b"], "order_id": ["o1", "o2"], "total": [1, 2]})
    sink.write(rows, Commit("orders", "orders_out", 0, 1))
""")


def committed_records(bootstrap: str, topic: str) -> list[tuple[str, dict, dict]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    found, ended = [], set()
    while len(ended) < len(partitions):
        for message in consumer.consume(500, 1.0):
            if message.error() is not None:
                ended.add(message.partition())
            else:
                found.append((message.key().decode(), json.loads(message.value()),
                              {k: v.decode() for k, v in message.headers() or ()}))
    consumer.close()
    return found


def test_a_writer_killed_mid_transaction_is_fenced_and_consumers_see_each_record_once(
    tmp_path: Path, kafka_broker: KafkaBroker
) -> None:
    topic = f"orders-out-{tmp_path.name[-8:]}"
    env = {**os.environ, "ONCEFLOW_HOME": str(tmp_path), "ONCEFLOW_PAUSE_AT": "sink.kafka.before_commit"}
    zombie = subprocess.Popen([sys.executable, "-c", WRITER, kafka_broker.bootstrap, topic], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_paused(tmp_path, "sink.kafka.before_commit", zombie)  # its records sent, its transaction open
    finally:
        zombie.send_signal(signal.SIGKILL)
        zombie.wait()
    sink = KafkaSink(bootstrap_servers=kafka_broker.bootstrap, topic=topic, key="order_id")
    commit = Commit("orders", "orders_out", 0, 1)
    assert not sink.committed(commit)
    rows = pa.table({"record_id": ["a", "b"], "order_id": ["o1", "o2"], "total": [1, 2]})
    sink.write(rows, commit)  # fences the zombie, aborting its transaction, then writes the commit
    assert sink.committed(commit)
    sink.write(rows, commit)  # written already: nothing sent
    again = KafkaSink(bootstrap_servers=kafka_broker.bootstrap, topic=topic, key="order_id")
    assert again.committed(commit) and not again.committed(Commit("orders", "orders_out", 0, 2))
    records = committed_records(kafka_broker.bootstrap, topic)
    assert sorted((key, value["total"], headers["record_id"]) for key, value, headers in records) == [
        ("o1", 1, "a"), ("o2", 2, "b")]
    assert {headers["onceflow_commit"] for _, _, headers in records} == {"orders/orders_out/0/1"}
