"""The public API type-checks as users write it: mypy over the declaration package and the README's example finds
nothing, and flags a mode or policy that is not one (the `Literal`s users' editors show). No Spark."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.installed_layout import installed_layout
from tests.test_docs import README, section

MISUSE = '''
from onceflow import FileSource, Pipeline, WindowedOutput

def same(records):
    return records

late = WindowedOutput(asset="a", window="5m", late_policy="keep", transform=same)
twice = Pipeline(name="p", source=FileSource(directory="/in", timestamp_field="ts"), schema="a INT",
                 delivery="twice")
'''


# What users' code is checked against is onceflow's own types; the libraries beneath are not read (what makes the
# check take seconds, not a minute: pyspark's and Dagster's sources are large).
MYPY_CONFIG = """
[mypy]
follow_imports = silent
show_error_context = False
error_summary = False
incremental = False

[mypy-pyspark.*,dagster.*,dagster_gcp.*,pandas.*,pyarrow.*,google.*,deltalake.*,confluent_kafka.*]
follow_imports = skip

# pyarrow ships no type information (the sinks' `rows` are its tables).
[mypy-pyarrow.*]
ignore_missing_imports = True
"""


def mypy(cwd: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    (cwd / "mypy.ini").write_text(MYPY_CONFIG)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(cwd / "mypy.ini"), "--python-executable", sys.executable,
         *targets],
        cwd=cwd, env={"MYPYPATH": str(cwd / "site"), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=300,
    )


def test_the_public_api_type_checks_and_refuses_what_it_does_not_take(tmp_path: Path) -> None:
    package = installed_layout(tmp_path / "site")
    example = re.findall(r"```python\n(.*?)```", section(README.read_text(), "## Add your own pipeline"), re.S)[0]
    (tmp_path / "example.py").write_text("\n".join(line[3:] for line in example.splitlines()))
    (tmp_path / "misuse.py").write_text(MISUSE)

    clean = mypy(tmp_path, "example.py", str(package / "__init__.py"), str(package / "jobs" / "declare"))
    assert (clean.returncode, clean.stdout, clean.stderr) == (0, "", "")
    flagged = mypy(tmp_path, "misuse.py")
    assert flagged.returncode == 1
    assert [line.split(": error: ")[1] for line in flagged.stdout.splitlines()] == [
        'Argument "late_policy" to "WindowedOutput" has incompatible type "Literal[\'keep\']"; expected '
        '"Literal[\'drop\', \'refire\']"  [arg-type]',
        'Argument "delivery" to "Pipeline" has incompatible type "Literal[\'twice\']"; expected '
        '"Literal[\'exactly_once\', \'at_least_once\']"  [arg-type]',
    ]
