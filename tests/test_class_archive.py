"""The Spark driver's class archive: `onceflow setup` made it, a driver onceflow starts maps it, and an archive the
JVM cannot use costs nothing but the speed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from onceflow.resources.class_archive import QUIET, class_archive_options, ensure_class_archive

SHARED = "org.apache.spark.SparkContext source: shared objects file (top)"


def test_a_driver_onceflow_starts_loads_sparks_classes_from_the_archive(tmp_path: Path) -> None:
    archive = ensure_class_archive()  # made by `onceflow setup`, which `make test` ran
    assert archive.stat().st_size > 50_000_000
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
