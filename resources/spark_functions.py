"""onceflow's own Java for Spark (beside the Python of the stages under `jobs/` that use it, and the session's own
here in `resources/`), compiled into a jar once a machine.

The jar is cached beside the Delta jars, named by a hash of its sources and of the Spark it is compiled against, so
a changed source or a new Spark builds a new jar and a checkout never runs another checkout's classes. It is
built with the JDK's `javac` (`JAVA_HOME`, else the `PATH`) against the jars of the installed PySpark, then moved
into place atomically: processes that build it at the same time each produce the same file. The ones called as
SQL functions are registered in each batch's session (`register_spark_functions`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import weakref
import zipfile
from pathlib import Path

import pyspark
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from onceflow.resources.maven_jars import jar_cache_dir

# Installed or in a checkout, `jobs` sits beside `resources`; each stage keeps its own Java beside its Python, and
# the session's own (`Py4JNoDelay`) is here.
SOURCES = Path(__file__).resolve().parent.parent / "jobs"


SQL_FUNCTIONS = {
    "onceflow_not_among": ("io.onceflow.NotAmong", T.BooleanType()),
    "onceflow_line_offset": ("io.onceflow.LineOffsets", T.LongType()),
}
"""onceflow's SQL functions: name → (Java class in the jar, result type)."""
JSON_RECORD = "onceflow_json_record"
"""Spark's `from_json` of a record, compiled into its stage (`io.onceflow.JsonRecord`; see `compiled_functions`)."""
UTF8_TEXT = "onceflow_utf8"
"""Spark's `try_validate_utf8(CAST(bytes AS STRING))`, compiled, quicker on ASCII (`io.onceflow.Utf8Text`; see
`compiled_functions`)."""


class JavaCompilerMissingError(RuntimeError):
    """No `javac` to build onceflow's Spark functions with: a JDK (not only a JRE) of Java 17 or later is needed."""


class SparkFunctionsMissingError(RuntimeError):
    """The Spark engine has no onceflow functions jar on its classpath (an engine onceflow did not start)."""


def register_spark_functions(spark: SparkSession) -> None:
    """Register onceflow's SQL functions in `spark`'s session where it lacks them (a restarted engine forgets them).

    They are registered together, the last of `SQL_FUNCTIONS` last, so an engine that has it has them all: one
    question a batch, not one per function. A classic session's functions live in its own JVM, as long as it:
    it is asked once.

    Raises `SparkFunctionsMissingError`, naming the fix, where the engine cannot load onceflow's classes.
    """
    classic = hasattr(spark, "_jsparkSession")
    if classic and spark in _REGISTERED:
        return
    if not spark.catalog.functionExists([*SQL_FUNCTIONS][-1]):
        # A classic session also gets the functions its batches are compiled with (`CompiledFunction.java`):
        # expressions, not UDFs, which only the session's own JVM can register.
        if classic:
            spark._jvm.io.onceflow.CompiledFunction.register(spark._jsparkSession)
        for name, (java_class, result) in SQL_FUNCTIONS.items():
            try:
                spark.udf.registerJavaFunction(name, java_class, result)
            except AnalysisException as error:
                if java_class not in str(error):
                    raise
                raise SparkFunctionsMissingError(
                    f"the Spark engine cannot load {java_class}, one of onceflow's Spark functions: start it with "
                    "the jar `onceflow setup` prints on its classpath (`--jars <jar>`)"
                ) from error
    if classic:
        _REGISTERED.add(spark)


_REGISTERED: weakref.WeakSet[SparkSession] = weakref.WeakSet()
SERVER_FUNCTIONS = "io.onceflow.SessionFunctions"
"""The `spark.sql.extensions` class that gives every session of an engine onceflow's compiled functions."""
SERVER_PLUGIN = "io.onceflow.ProjectionPlugin"
"""The Spark Connect relation plugin that evaluates a client's projection of its rows on the server's driver
(`onceflow.jobs.ingest.local_projection.evaluated_on_driver`): every server onceflow starts has it, beside
`SERVER_FUNCTIONS`."""


def compiled_functions(spark: SparkSession) -> bool:
    """Whether `spark`'s batches can use onceflow's compiled functions (`JSON_RECORD`, `UTF8_TEXT`,
    `onceflow_batch_value`, `onceflow_id_hash`): a classic session registers them (`register_spark_functions`); a
    Spark Connect server has them when it was started with `SERVER_FUNCTIONS` (every engine onceflow starts is, and
    with `SERVER_PLUGIN` too), asked once per session: a server started anew is a new session."""
    if hasattr(spark, "_jsparkSession"):
        register_spark_functions(spark)
        return True
    if spark not in _SERVED:
        _SERVED[spark] = spark.catalog.functionExists(JSON_RECORD)
    return _SERVED[spark]


_SERVED: weakref.WeakKeyDictionary[SparkSession, bool] = weakref.WeakKeyDictionary()


def ensure_spark_functions_jar(cache_dir: Path | None = None) -> Path:
    """Return the path of the jar of onceflow's Spark functions, building it first if it is not cached."""
    sources = sorted([*SOURCES.glob("*/*.java"), *Path(__file__).resolve().parent.glob("*.java")])
    digest = hashlib.sha256(pyspark.__version__.encode())
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    jar = (cache_dir or jar_cache_dir()) / "onceflow" / f"onceflow-functions-{digest.hexdigest()[:16]}.jar"
    if not jar.exists():
        _build(sources, jar)
    return jar


def _javac() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(java_home) / "bin" / "javac")] if java_home else []
    for candidate in [*candidates, shutil.which("javac")]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise JavaCompilerMissingError(
        "onceflow compiles its Spark functions with `javac`, found neither in JAVA_HOME nor on the PATH: "
        "install a JDK 17 (Debian: openjdk-17-jdk-headless)"
    )


def _build(sources: list[Path], jar: Path) -> None:
    jar.parent.mkdir(parents=True, exist_ok=True)
    spark_jars = Path(pyspark.__file__).parent / "jars"
    with tempfile.TemporaryDirectory(dir=jar.parent) as work:
        classes = Path(work) / "classes"
        result = subprocess.run(
            [_javac(), "--release", "17", "-nowarn", "-cp", f"{spark_jars}/*", "-d", str(classes),
             *map(str, sources)],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"javac failed on {[s.name for s in sources]}:\n{result.stderr[-3000:]}")
        built = Path(work) / jar.name
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        os.replace(built, jar)
