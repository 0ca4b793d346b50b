"""Artifacts from Maven Central, cached on this machine: the plumbing every jar onceflow fetches goes through.

A single artifact (a jar, or a POM to read) comes straight from Maven Central, is checked against its published
SHA-1 and moved into place atomically; where the network reaches Maven Central only through Maven's own settings
(mirrors, proxies), `mvn` fetches it instead. A whole dependency tree (the tests' Kafka broker) is resolved by
`mvn` into a temporary directory that is renamed into place, so a cache directory is either complete or absent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple
from xml.sax.saxutils import escape

from onceflow.resources.settings import load_settings

log = logging.getLogger("onceflow")

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
# Pinned so that resolution does not depend on the plugin version a Maven installation defaults to.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"


class MavenArtifact(NamedTuple):
    group: str
    artifact: str
    version: str
    classifier: str | None = None
    packaging: str = "jar"

    @property
    def file_name(self) -> str:
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.{self.packaging}"

    @property
    def url(self) -> str:
        return f"{MAVEN_CENTRAL}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


class MavenMissingError(RuntimeError):
    """An artifact needs `mvn` (Apache Maven) and it is not installed."""


def jar_cache_dir() -> Path:
    """`ONCEFLOW_JARS_DIR`, else `~/.cache/onceflow/jars`: shared by every checkout on the machine."""
    configured = load_settings().jars_dir
    return Path(configured) if configured else Path.home() / ".cache" / "onceflow" / "jars"


def ensure_artifact(artifact: MavenArtifact, directory: Path) -> Path:
    """The path of `artifact` in `directory`, downloaded first if it is not there yet."""
    path = directory / artifact.file_name
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        _download(artifact, path)
    return path


def ensure_dependencies(artifacts: Sequence[MavenArtifact], directory: Path) -> list[Path]:
    """The jars of `artifacts` and of their runtime dependencies in `directory`, resolved by `mvn` (a Maven
    dependency tree: versions mediated, exclusions honoured) the first time."""
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory.parent, prefix=f".{directory.name}-") as work:
            resolved = Path(work) / "jars"
            _copy_dependencies(artifacts, Path(work), resolved)
            try:
                resolved.rename(directory)
            except OSError:
                if not directory.is_dir():
                    raise
                # Another process finished the same directory first: its copy is as good as this one.
    return sorted(directory.glob("*.jar"))


def _download(artifact: MavenArtifact, path: Path) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            urllib.request.urlretrieve(artifact.url, tmp, reporthook=_progress(artifact.file_name))
            expected = urllib.request.urlopen(f"{artifact.url}.sha1", timeout=60).read().decode().split()[0]
        except OSError:
            _download_with_maven(artifact, tmp)
            expected = None
        if expected is not None:
            actual = hashlib.sha1(tmp.read_bytes()).hexdigest()
            if actual != expected:
                raise RuntimeError(f"checksum mismatch for {artifact.url}: expected {expected}, got {actual}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _progress(name: str) -> Callable[[int, int, int], None]:
    """A download's progress on `onceflow`'s logger: its size when it starts, then each further tenth of it."""
    shown = [-1]

    def report(blocks: int, block_size: int, total: int) -> None:
        tenth = min(10, blocks * block_size * 10 // total) if total > 0 else 0
        if tenth > shown[0]:
            shown[0] = tenth
            size = "size unknown" if total <= 0 else (f"{total / 2**20:.1f} MB" if total >= 2**20 else
                                                      f"{total // 1024} KB")
            log.info(f"fetching {name} ({size}) from Maven Central: {tenth * 10}%")

    return report


def _mvn(what: str) -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenMissingError(
            f"{what} needs Apache Maven (`mvn`), which is not installed (Debian: apt-get install maven)"
        )
    return mvn


def _download_with_maven(artifact: MavenArtifact, dest: Path) -> None:
    group, name, release, classifier, packaging = artifact
    spec = f"{group}:{name}:{release}:{packaging}" + (f":{classifier}" if classifier else "")
    mvn = _mvn(f"downloading {name} (Maven Central is not reachable directly)")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [mvn, "-q", "-B", f"{DEPENDENCY_PLUGIN}:copy", f"-Dartifact={spec}", f"-DoutputDirectory={out}"],
            check=True,
        )
        shutil.move(str(next(Path(out).glob(f"*.{packaging}"))), dest)


def _copy_dependencies(artifacts: Sequence[MavenArtifact], work: Path, out: Path) -> None:
    """Resolve `artifacts` with a generated POM that depends on them: `mvn` copies the runtime tree to `out`."""
    mvn = _mvn(f"resolving {', '.join(a.artifact for a in artifacts)}")
    dependencies = "".join(
        f"<dependency><groupId>{escape(a.group)}</groupId><artifactId>{escape(a.artifact)}</artifactId>"
        f"<version>{escape(a.version)}</version>"
        + (f"<classifier>{escape(a.classifier)}</classifier>" if a.classifier else "")
        + "</dependency>"
        for a in artifacts
    )
    (work / "pom.xml").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>io.onceflow</groupId><artifactId>resolve</artifactId><version>0</version>"
        f"<packaging>pom</packaging><dependencies>{dependencies}</dependencies></project>"
    )
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(work / "pom.xml"), f"{DEPENDENCY_PLUGIN}:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={out}"],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        names = ", ".join(":".join(a[:3]) for a in artifacts)
        raise RuntimeError(f"mvn could not resolve {names}: {(result.stdout + result.stderr)[-3000:]}")
