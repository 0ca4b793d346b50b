"""A real Apache Kafka broker in KRaft mode (its own controller, no ZooKeeper) as a managed subprocess on loopback.

Its jars are Apache Kafka's Maven Central artifacts (`org.apache.kafka:kafka_2.13` and its runtime dependencies,
with log4j2's SLF4J binding, without which it logs nothing), resolved by `mvn` once into the jar cache. A start
writes `server.properties` for one node that is broker and controller on two free 127.0.0.1 ports, formats its
storage (`kafka.tools.StorageTool`, a standalone quorum) and runs `kafka.Kafka` in its own process group; it is
ready when an AdminClient lists its topics. Internal topics (consumer offsets, transaction state) have one
replica, so transactional producers and consumer groups work on the single node.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions

from onceflow.resources.delta_jars import SCALA_BINARY
from onceflow.resources.emulators.pubsub import free_port
from onceflow.resources.kafka import KafkaClient
from onceflow.resources.maven_jars import MavenArtifact, ensure_dependencies, jar_cache_dir
from onceflow.resources.processes import listens, stop_process_group

KAFKA_VERSION = "4.1.2"
BROKER_ARTIFACTS = (
    MavenArtifact("org.apache.kafka", f"kafka_{SCALA_BINARY}", KAFKA_VERSION),
    # Kafka 4.1 logs through SLF4J 1.7; its own distribution routes that to log4j2 with this binding.
    MavenArtifact("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3"),
)
# A test broker's JVM: a small heap, and C1 alone, which gets a short-lived server to its first request sooner.
JVM_OPTIONS = ("-Xmx512m", "-Xms128m", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
LOG4J2_PROPERTIES = """\
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
"""


class KafkaBrokerError(RuntimeError):
    """The broker could not be started (no Java, its storage not formatted, it exited or never answered)."""


def ensure_kafka_broker_libs(cache_dir: Path | None = None) -> Path:
    """The directory of the broker's jars (`<jar cache>/kafka/<version>/libs`), resolved by `mvn` the first time."""
    libs = (cache_dir or jar_cache_dir()) / "kafka" / KAFKA_VERSION / "libs"
    ensure_dependencies(BROKER_ARTIFACTS, libs)
    return libs


@dataclass
class KafkaBroker:
    """A running broker; `bootstrap` ("127.0.0.1:port") is what clients' `bootstrap.servers` must be set to."""

    process: subprocess.Popen[bytes]
    bootstrap: str
    data_dir: Path
    log_path: Path

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(
        self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None, timeout_s: float = 30.0
    ) -> None:
        """Create `topic` with `partitions` partitions (topic `config` such as `retention.ms`) and wait until every
        partition has a leader."""
        KafkaClient(self.bootstrap).create_topic(topic, partitions, config)
        self._await_partitions(topic, partitions, timeout_s)

    def add_partitions(self, topic: str, total: int, timeout_s: float = 30.0) -> None:
        """Grow `topic` to `total` partitions and wait until every partition has a leader."""
        admin = self.admin()
        admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout_s)
        self._await_partitions(topic, total, timeout_s)

    def stop(self) -> None:
        stop_process_group(self.process)

    def _await_partitions(self, topic: str, partitions: int, timeout_s: float) -> None:
        admin, deadline = self.admin(), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            metadata = admin.list_topics(topic, timeout=5).topics[topic]
            led = [p for p in metadata.partitions.values() if p.leader >= 0]
            if metadata.error is None and len(led) == partitions:
                return
            time.sleep(0.1)
        raise KafkaBrokerError(f"topic {topic} did not get {partitions} partitions with leaders in {timeout_s:.0f}s")


def start_kafka_broker(
    data_dir: Path | None = None, port: int | None = None, timeout_s: float = 90.0, cache_dir: Path | None = None
) -> KafkaBroker:
    """Start a single-node KRaft broker on 127.0.0.1 (`port`, else a free one) keeping its logs in `data_dir` (else a
    new temporary directory), and wait until it answers an AdminClient."""
    java = shutil.which("java")
    if java is None:
        raise KafkaBrokerError("the Kafka broker needs Java 17 (`java` on the PATH)")
    classpath = f"{ensure_kafka_broker_libs(cache_dir)}/*"
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="onceflow-kafka-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    port, controller_port = port or free_port(), free_port()
    properties = data_dir / "server.properties"
    properties.write_text(_server_properties(data_dir / "logs", port, controller_port))
    (data_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    command = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={data_dir / 'log4j2.properties'}", "-cp", classpath]
    log_path = data_dir / "broker.log"
    # Kafka's cluster IDs are 16 random bytes in URL-safe base64 without padding, never starting with "-" (as
    # Kafka's own `Uuid.randomUuid`): the storage tool would read one that does as an option.
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    formatted = subprocess.run(
        [*command, "kafka.tools.StorageTool", "format", "--standalone", "--cluster-id", cluster_id,
         "--config", str(properties)],
        capture_output=True, text=True,
    )
    if formatted.returncode != 0:
        raise KafkaBrokerError(f"formatting the broker's storage failed: {(formatted.stdout + formatted.stderr)[-3000:]}")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, "kafka.Kafka", str(properties)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    broker = KafkaBroker(process, f"127.0.0.1:{port}", data_dir, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise KafkaBrokerError(f"the Kafka broker exited: {_tail(log_path)}")
        if _answers(broker):
            return broker
        time.sleep(0.2)
    broker.stop()
    raise KafkaBrokerError(f"the Kafka broker did not answer on {broker.bootstrap} within {timeout_s:.0f}s: "
                           f"{_tail(log_path)}")


def _server_properties(log_dir: Path, port: int, controller_port: int) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "log.dirs": str(log_dir),
        # One node: internal topics get one replica, and one partition each (their default of 50 is start-up work
        # a test broker does not need).
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Topics exist only where a test or a user created them, with the partitions they chose.
        "auto.create.topics.enable": "false",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _answers(broker: KafkaBroker) -> bool:
    """Whether the broker serves metadata; an AdminClient is only asked once the broker itself listens on its port
    (before that, its client library logs every refused connection; and another process's server that took the
    port first must not pass for this broker)."""
    if not listens(broker.process, int(broker.bootstrap.rsplit(":", 1)[1])):
        return False
    try:
        broker.admin().list_topics(timeout=2)
        return True
    except (OSError, KafkaException):
        return False


def _tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-3000:] if log_path.exists() else "(no log)"
