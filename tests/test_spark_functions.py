"""onceflow's own Spark functions: compiled once into a cached jar, named by what it was built from."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from resources import spark_functions
from resources.spark_functions import JavaCompilerMissingError, ensure_spark_functions_jar


def test_the_jar_is_built_once_and_rebuilt_when_a_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = ensure_spark_functions_jar(tmp_path)

    assert "io/onceflow/LineOffsets.class" in zipfile.ZipFile(jar).namelist()
    built_at = jar.stat().st_mtime_ns
    assert ensure_spark_functions_jar(tmp_path) == jar and jar.stat().st_mtime_ns == built_at
    assert [p.name for p in (tmp_path / "onceflow").iterdir()] == [jar.name]  # no work files left behind

    sources = tmp_path / "jvm"
    sources.mkdir()
    for source in spark_functions.SOURCES.glob("*.java"):
        (sources / source.name).write_text(source.read_text() + "\n// changed\n")
    monkeypatch.setattr(spark_functions, "SOURCES", sources)
    rebuilt = ensure_spark_functions_jar(tmp_path)
    assert rebuilt != jar and rebuilt.exists()


def test_a_machine_without_javac_gets_an_error_that_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jre-only"))
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(JavaCompilerMissingError, match="install a JDK 17"):
        ensure_spark_functions_jar(tmp_path / "cache")
