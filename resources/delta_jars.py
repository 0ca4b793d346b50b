"""The Delta Lake jars that match the installed `delta-spark` package, and the GCS connector.

They come from Maven Central once and are then reused from the local jar cache (`onceflow.resources.maven_jars`),
so a Spark session never needs the network after set-up.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from onceflow.resources.maven_jars import MavenArtifact, ensure_artifact, jar_cache_dir

SCALA_BINARY = "2.13"
ARTIFACTS = (f"delta-spark_{SCALA_BINARY}", "delta-storage")
# Spark's `gs://` file system (Hadoop's GCS connector), shaded so its Google client libraries cannot clash with
# Spark's own: Delta tables, landing files and published files on a `gs://` home.
GCS_CONNECTOR = MavenArtifact("com.google.cloud.bigdataoss", "gcs-connector", "4.0.4", "shaded")


def delta_version() -> str:
    """The Delta version the jars must have: the installed `delta-spark` Python package's."""
    return version("delta-spark")


def ensure_delta_jars(cache_dir: Path | None = None) -> list[Path]:
    """Return the paths of the Delta jars, downloading any that are not cached yet."""
    target = (cache_dir or jar_cache_dir()) / delta_version()
    return [ensure_artifact(MavenArtifact("io.delta", artifact, delta_version()), target) for artifact in ARTIFACTS]


def ensure_gcs_connector_jar(cache_dir: Path | None = None) -> Path:
    """The path of the GCS connector jar (`GCS_CONNECTOR`), downloaded if it is not cached yet."""
    return ensure_artifact(GCS_CONNECTOR, (cache_dir or jar_cache_dir()) / "gcs")
