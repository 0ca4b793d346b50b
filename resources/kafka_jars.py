"""Spark's Kafka connector (`spark.read.format("kafka")`) at the installed pyspark version, with the jars it needs.

Which jars it needs is read from the connector's own POM on Maven Central (cached beside the jars): its compile
and runtime dependencies, less those Spark's own jars already hold (a second copy of a class on Spark's classpath
is trouble). pyproject pins pyspark exactly, so these jars and the installed Spark are always the same release.
"""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

import pyspark

from onceflow.resources.delta_jars import SCALA_BINARY
from onceflow.resources.maven_jars import MavenArtifact, ensure_artifact, jar_cache_dir

SPARK_KAFKA = f"spark-sql-kafka-0-10_{SCALA_BINARY}"
POM_NAMESPACE = {"m": "http://maven.apache.org/POM/4.0.0"}


class ConnectorPomError(RuntimeError):
    """The Kafka connector's POM names a dependency onceflow cannot fetch as it stands (an unresolved version)."""


def ensure_spark_kafka_jars(cache_dir: Path | None = None) -> list[Path]:
    """The paths of Spark's Kafka connector jars for the installed pyspark, downloaded if not cached yet."""
    target = (cache_dir or jar_cache_dir()) / "spark-kafka" / pyspark.__version__
    connector = MavenArtifact("org.apache.spark", SPARK_KAFKA, pyspark.__version__)
    pom = ensure_artifact(connector._replace(packaging="pom"), target)
    return [ensure_artifact(artifact, target) for artifact in [connector, *connector_dependencies(pom)]]


def connector_dependencies(pom: Path) -> list[MavenArtifact]:
    """The jars the connector of `pom` needs on a Spark classpath: its compile and runtime dependencies that are
    not among the installed Spark's jars."""
    shipped = [jar.name for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")]
    needed = []
    for dependency in ElementTree.parse(pom).getroot().iterfind("m:dependencies/m:dependency", POM_NAMESPACE):
        scope, packaging = _text(dependency, "scope", "compile"), _text(dependency, "type", "jar")
        if scope not in ("compile", "runtime") or packaging != "jar" or _text(dependency, "optional") == "true":
            continue
        if _text(dependency, "classifier"):
            continue
        artifact = MavenArtifact(*(_text(dependency, name) for name in ("groupId", "artifactId", "version")))
        if any(re.fullmatch(rf"{re.escape(artifact.artifact)}-\d.*\.jar", name) for name in shipped):
            continue
        if not re.fullmatch(r"[\w.-]+", artifact.version):
            raise ConnectorPomError(f"{pom.name}: dependency {artifact.artifact} has version {artifact.version!r}")
        needed.append(artifact)
    return needed


def _text(element: ElementTree.Element, name: str, default: str = "") -> str:
    return (element.findtext(f"m:{name}", default, POM_NAMESPACE) or default).strip()
