"""Fetch and cache the Delta Lake jars that match the installed `delta-spark` package, and the GCS connector.

The jars come from Maven Central once and are then reused from a local cache, so a Spark session never needs the
network after set-up. Each download is checked against Maven's published SHA-1 and moved into place atomically.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import urllib.request
from importlib.metadata import version
from pathlib import Path

from onceflow.resources.settings import load_settings

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
SCALA_BINARY = "2.13"
ARTIFACTS = (f"delta-spark_{SCALA_BINARY}", "delta-storage")
# Spark's `gs://` file system (Hadoop's GCS connector), shaded so its Google client libraries cannot clash with
# Spark's own: Delta tables, landing files and published files on a `gs://` home.
GCS_CONNECTOR = ("com.google.cloud.bigdataoss", "gcs-connector", "4.0.4", "shaded")


def delta_version() -> str:
    """The Delta version the jars must have: the installed `delta-spark` Python package's."""
    return version("delta-spark")


def jar_cache_dir() -> Path:
    """`ONCEFLOW_JARS_DIR`, else `~/.cache/onceflow/jars`: shared by every checkout on the machine."""
    configured = load_settings().jars_dir
    return Path(configured) if configured else Path.home() / ".cache" / "onceflow" / "jars"


def ensure_delta_jars(cache_dir: Path | None = None) -> list[Path]:
    """Return the paths of the Delta jars, downloading any that are not cached yet."""
    target = (cache_dir or jar_cache_dir()) / delta_version()
    target.mkdir(parents=True, exist_ok=True)
    jars = []
    for artifact in ARTIFACTS:
        jar = target / f"{artifact}-{delta_version()}.jar"
        if not jar.exists():
            _download(("io.delta", artifact, delta_version(), None), jar)
        jars.append(jar)
    return jars


def ensure_gcs_connector_jar(cache_dir: Path | None = None) -> Path:
    """The path of the GCS connector jar (`GCS_CONNECTOR`), downloaded if it is not cached yet."""
    _, artifact, release, classifier = GCS_CONNECTOR
    target = (cache_dir or jar_cache_dir()) / "gcs"
    target.mkdir(parents=True, exist_ok=True)
    jar = target / f"{artifact}-{release}-{classifier}.jar"
    if not jar.exists():
        _download(GCS_CONNECTOR, jar)
    return jar


def _download(coordinates: tuple[str, str, str, str | None], jar: Path) -> None:
    """Download the Maven artifact `(group, artifact, version, classifier)` to `jar`."""
    group, artifact, release, _ = coordinates
    url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{release}/{jar.name}"
    fd, tmp_name = tempfile.mkstemp(dir=jar.parent, suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            urllib.request.urlretrieve(url, tmp)
            expected = urllib.request.urlopen(f"{url}.sha1", timeout=60).read().decode().split()[0]
        except OSError:
            # Some networks reach Maven Central only through Maven's own settings (mirrors, proxies).
            _download_with_maven(coordinates, tmp)
            expected = None
        if expected is not None:
            actual = hashlib.sha1(tmp.read_bytes()).hexdigest()
            if actual != expected:
                raise RuntimeError(f"checksum mismatch for {url}: expected {expected}, got {actual}")
        os.replace(tmp, jar)
    finally:
        tmp.unlink(missing_ok=True)


def _download_with_maven(coordinates: tuple[str, str, str, str | None], dest: Path) -> None:
    group, artifact, release, classifier = coordinates
    if shutil.which("mvn") is None:
        raise RuntimeError(f"cannot download {artifact} from Maven Central and `mvn` is not installed")
    spec = f"{group}:{artifact}:{release}:jar:{classifier}" if classifier else f"{group}:{artifact}:{release}"
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["mvn", "-q", "dependency:copy", f"-Dartifact={spec}", f"-DoutputDirectory={out}"], check=True)
        shutil.move(str(next(Path(out).glob("*.jar"))), dest)
