"""A class-data-sharing archive of the Spark driver's classes: a driver JVM that maps it starts and plans its first
Delta queries in about 12 s instead of 20 (measured on this 2-core machine), because the classes of Spark, Scala and
Hadoop come parsed and verified from the archive instead of from 200 jars.

`onceflow setup` dumps it once per installation (a Spark session doing Delta work, with
`-XX:ArchiveClassesAtExit`), under the jar cache, named for the JVM and the pyspark it was made with. Every driver
JVM onceflow starts, classic sessions and the Spark Connect server alike, then maps it (`class_archive_options`).
The JVM checks the archive against its own version and class path: one made by another JDK or another install is
not used, and the JVM starts as it would without it, silently (`-Xlog:cds*=off`). Nothing depends on it but speed.

Each archive is about 200 MB, and every checkout's install makes its own: beside each, a note of the JVM and the Spark
home it was made for, and set-up removes the archives whose JVM or Spark home is gone (a deleted checkout's).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark
from pydantic import BaseModel
from pyspark import SparkContext

from onceflow.resources.maven_jars import jar_cache_dir
from onceflow.resources.spark_cluster import spark_home

log = logging.getLogger("onceflow")

QUIET = "-Xlog:cds*=off"
"""The JVM's notes on an archive it cannot use (or, while dumping, on classes it leaves out) go to stdout."""


class ClassArchiveError(RuntimeError):
    """The dump of the class archive did not produce one."""


class ArchiveOrigin(BaseModel):
    """What an archive was made for, kept beside it (`<archive>.json`): the JVM, the Spark home, and that home's
    install (its jars' directory's change time: a JVM refuses an archive whose jars were written again, so a
    pyspark reinstalled in place, or a virtualenv made again at the same path, needs an archive of its own)."""

    java: str
    spark_home: str
    installed_ns: int | None = None

    @classmethod
    def here(cls) -> ArchiveOrigin:
        home = spark_home()
        return cls(java=os.path.realpath(shutil.which("java") or "java"), spark_home=str(home),
                   installed_ns=_installed_ns(home))

    def gone(self) -> bool:
        if not (Path(self.java).exists() and Path(self.spark_home).is_dir()):
            return True
        return self.installed_ns is not None and self.installed_ns != _installed_ns(Path(self.spark_home))


def _installed_ns(home: Path) -> int | None:
    try:
        return (home / "jars").stat().st_mtime_ns
    except OSError:
        return None


def class_archive_path(cache_dir: Path | None = None) -> Path:
    """Where the archive of this JVM and this pyspark install is (or would be)."""
    origin = ArchiveOrigin.here()
    key = f"{origin.java}|{pyspark.__version__}|{origin.spark_home}|{origin.installed_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return (cache_dir or jar_cache_dir()) / "class-archives" / f"spark-{pyspark.__version__}-{digest}.jsa"


def class_archive_options(cache_dir: Path | None = None) -> str:
    """The driver JVM options that map the archive; empty before `ensure_class_archive` made one."""
    path = class_archive_path(cache_dir)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""


def ensure_class_archive(cache_dir: Path | None = None, timeout_s: float = 600) -> Path:
    """The archive, dumped first if missing: a child process runs a Spark session through Delta's common work and
    its JVM writes the archive as it exits. Written to a temporary name and renamed, so a reader never maps half."""
    path = class_archive_path(cache_dir)
    remove_orphan_archives(path.parent)
    note = path.with_name(f"{path.name}.json")
    if path.is_file():
        if not note.is_file():  # made before notes were kept: it is this install's
            note.write_text(ArchiveOrigin.here().model_dump_json())
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("dumping the Spark driver's class archive (about a minute, once per install)")
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    done = subprocess.run(
        [sys.executable, "-m", "onceflow.resources.class_archive", str(partial)],
        capture_output=True, text=True, timeout=timeout_s,
    )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise ClassArchiveError(f"the JVM wrote no class archive (exit {done.returncode}): {done.stderr[-2000:]}")
    note.write_text(ArchiveOrigin.here().model_dump_json())
    os.replace(partial, path)
    return path


def remove_orphan_archives(directory: Path) -> None:
    """Remove the archives whose JVM or Spark home is gone. A driver still mapping one keeps its pages (Linux
    frees an unlinked file once unmapped); one without a note (made before notes were kept) is left alone."""
    for note in directory.glob("*.jsa.json"):
        try:
            gone = ArchiveOrigin.model_validate_json(note.read_text()).gone()
        except (OSError, ValueError):
            continue
        if gone:
            note.with_suffix("").unlink(missing_ok=True)
            note.unlink(missing_ok=True)


def _dump(target: Path) -> None:
    """Run a driver through Delta's common work with `-XX:ArchiveClassesAtExit=target`; return once it exited."""
    # Imported here: the session module imports this one, to map the archive.
    from onceflow.resources.spark import ENGINE_CONF, build_spark_session

    # Dumped by a JVM with the engines' own options (their collector among them), as the drivers that map it run.
    options = f"{ENGINE_CONF['spark.driver.extraJavaOptions']} -XX:ArchiveClassesAtExit={target} {QUIET}"
    spark = build_spark_session(app_name="onceflow-class-archive", conf={"spark.driver.extraJavaOptions": options})
    with tempfile.TemporaryDirectory() as work:
        table = f"delta.`{work}/t`"
        spark.sql(f"CREATE TABLE {table} (id STRING, n BIGINT, at TIMESTAMP) USING delta")
        spark.sql(f"INSERT INTO {table} VALUES ('a', 1, current_timestamp())")
        spark.sql(f"MERGE INTO {table} t USING (SELECT 'b' AS id, 2L AS n, current_timestamp() AS at) s "
                  "ON t.id = s.id WHEN NOT MATCHED THEN INSERT *")
        spark.read.json(spark.sparkContext.parallelize(['{"id": "c", "n": 3}'])).count()
        spark.sql(f"SELECT id, count(*), max(at) FROM {table} GROUP BY id").toArrow()
        jvm = SparkContext._gateway.proc  # the driver JVM (spark-submit execs it)
        spark.stop()
        jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive as it does
        jvm.wait(timeout=300)


if __name__ == "__main__":
    _dump(Path(sys.argv[1]))
