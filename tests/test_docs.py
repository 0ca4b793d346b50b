"""The README and docs/ say what the code does: links resolve, the settings tables match `Settings` and the
declaration, and the "Add your own pipeline" example runs as written. No Spark."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from pydantic import AliasChoices

from onceflow import (
    BigQuerySink,
    FileSink,
    FileSource,
    KafkaSink,
    KafkaSource,
    Pipeline,
    PostgresSink,
    PubSubSource,
    RecordOutput,
    WindowedOutput,
)
from onceflow.orchestration.pipelines import load_pipelines
from onceflow.resources.settings import PREFIX, Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
VARIABLE = re.compile(r"\b(?:ONCEFLOW|PUBSUB|BIGQUERY|STORAGE|DAGSTER)_[A-Z0-9_]*[A-Z0-9]\b")
# Read by the test harness (tests/conftest.py), not by onceflow: named in the README's account of `make test`.
TEST_HARNESS_VARIABLES = {"ONCEFLOW_TEST_ENGINE"}


def section(text: str, heading: str) -> str:
    """The body under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(rf"\n#{{1,{len(level)}}} ", text[start:])
    return text[start : start + following.start()] if following else text[start:]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row of `text`, header and separator rows left out."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    return [row for row in rows[2:] if not set(row[0]) <= {"-", ":"}] if rows else []


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def env_names() -> set[str]:
    """Every variable `Settings` reads: `ONCEFLOW_<FIELD>`, or the names a field's alias lists."""
    names = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice) for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(f"{PREFIX}{name.upper()}")
    return names


@pytest.mark.parametrize("page", [README, ROOT / "CHANGELOG.md", *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_readme_is_a_newcomers_page() -> None:
    readme = README.read_text()
    assert len(readme) < 10_000
    # No reference to a document the repository does not hold.
    assert "DESIGN.md" not in readme and "../shared" not in readme
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_docs_has_one_page_per_stage_and_the_readme_links_each() -> None:
    names = {p.stem for p in PAGES}
    assert {"sources", "ingest", "dedup", "delta", "windows", "publish", "verify"} <= names
    readme = README.read_text()
    assert not [
        p.name for p in PAGES if f"](docs/{p.name})" not in readme and f"](docs/{p.name}#" not in readme
    ]


def test_runtime_knob_table_lists_every_setting_and_nothing_else() -> None:
    knobs = section(SETTINGS_PAGE.read_text(), "## Runtime knobs")
    listed = {name for row in table_rows(knobs) for name in VARIABLE.findall(row[0])}
    assert listed == env_names()


def test_every_variable_the_docs_name_is_a_setting() -> None:
    known = env_names() | TEST_HARNESS_VARIABLES
    for name in TEST_HARNESS_VARIABLES:
        assert name in (ROOT / "tests" / "conftest.py").read_text()
    named = {
        (page.relative_to(ROOT).as_posix(), name)
        for page in [README, *PAGES]
        for name in re.findall(r"\bONCEFLOW_[A-Z0-9_]*[A-Z0-9]\b", page.read_text())
    }
    assert not {(page, name) for page, name in named if name not in known}


def test_declaration_table_lists_every_field_a_pipeline_declares() -> None:
    rows = table_rows(section(SETTINGS_PAGE.read_text(), "## What a pipeline declares"))
    listed = set()
    for row in rows:
        owner, *fields = re.findall(r"`([^`]+)`", row[0])
        cls, _, first = owner.partition(".")
        listed.update(f"{cls}.{field}" for field in (first, *fields))
    declared = {
        f"{cls.__name__}.{f.name}"
        for cls in (Pipeline, PubSubSource, FileSource, KafkaSource, WindowedOutput, FileSink, BigQuerySink,
                    RecordOutput, PostgresSink, KafkaSink)
        for f in dataclasses.fields(cls) if not f.name.startswith("_")
    }
    assert listed == declared


def test_add_your_own_pipeline_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_package: str
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", section(README.read_text(), "## Add your own pipeline"), re.S)
    declaration, definitions = (_dedent(block) for block in blocks[:2])
    package = tmp_path / user_package
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pipelines.py").write_text(declaration)
    monkeypatch.syspath_prepend(str(tmp_path))

    # The bundled code location's way: ONCEFLOW_PIPELINES names the module, its PIPELINES list is loaded.
    monkeypatch.delenv("BIGQUERY_EMULATOR_HOST", raising=False)  # else it is the sinks' endpoint
    settings = Settings(
        home=str(tmp_path / "home"), pipelines="my_project.pipelines", bigquery_dataset="sales"
    )
    (orders,) = load_pipelines(settings)
    assert isinstance(orders, Pipeline) and orders.name == "orders" and orders.raw_table == "raw/orders"
    assert [o.table for o in orders.outputs] == ["windows/region_sales"]
    assert orders.outputs[0].sinks == (FileSink(), BigQuerySink(table="region_sales", dataset="sales"))
    # A project's own definitions module imports it the same way.
    assert "defs = onceflow.definitions([orders])" in definitions
    compile(definitions, "my_project/definitions.py", "exec")


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"
