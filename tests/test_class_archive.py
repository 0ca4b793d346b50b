"""The Spark driver's class archive: `onceflow setup` made it, a driver onceflow starts maps it, and an archive the
JVM cannot use costs nothing but the speed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from onceflow.resources.class_archive import (
    QUIET,
    ArchiveOrigin,
    class_archive_options,
    ensure_class_archive,
    remove_orphan_archives,
)

SHARED = "org.apache.spark.SparkContext source: shared objects file (top)"


def test_a_driver_onceflow_starts_loads_sparks_classes_from_the_archive(tmp_path: Path) -> None:
    archive = ensure_class_archive()  # made by `onceflow setup`, which `make test` ran
    assert archive.stat().st_size > 50_000_000
    assert ArchiveOrigin.model_validate_json(archive.with_name(f"{archive.name}.json").read_text()) == ArchiveOrigin.here()
    assert class_archive_options() == f"-XX:SharedArchiveFile={archive} {QUIET}"
    loads = tmp_path / "class-load.log"
    # A classic session in a process of its own, logging where each class came from.
    script = (
        "from onceflow.resources.spark import build_spark_session\n"
        "spark = build_spark_session(app_name='archive-test', conf={'spark.driver.extraJavaOptions': "
        f"'-Xlog:class+load=info:file={loads}'}})\n"
        "assert spark.range(3).count() == 3\n"
    )
    # This process may hold a Spark Connect client, which pyspark marks in the environment a child inherits.
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert SHARED in loads.read_text()


def test_an_archive_the_jvm_cannot_use_is_ignored_without_a_word(tmp_path: Path) -> None:
    unusable = tmp_path / "other.jsa"
    unusable.write_bytes(b"not an archive of this JVM" * 1000)
    done = subprocess.run(
        ["java", f"-XX:SharedArchiveFile={unusable}", QUIET, "-version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert done.stdout == "" and "openjdk version" in done.stderr.lower() and "archive" not in done.stderr


def test_set_up_removes_the_archives_of_installs_that_are_gone_and_only_those(tmp_path: Path) -> None:
    here = ArchiveOrigin.here()
    origins = {"gone-checkout": here.model_copy(update={"spark_home": str(tmp_path / "deleted" / "pyspark")}),
               "gone-jdk": here.model_copy(update={"java": str(tmp_path / "jdk-0" / "bin" / "java")}),
               "this-install": here}
    for name, origin in origins.items():
        (tmp_path / f"{name}.jsa").write_bytes(b"archive")
        (tmp_path / f"{name}.jsa.json").write_text(origin.model_dump_json())
    (tmp_path / "no-note.jsa").write_bytes(b"archive")  # made before notes were kept: whose, nobody knows

    remove_orphan_archives(tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-note.jsa", "this-install.jsa", "this-install.jsa.json"]
