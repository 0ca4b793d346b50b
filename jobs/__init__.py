"""The pipeline's stages, one subpackage each, and the Dagster job shells that run them.

Stages, each importing only the ones listed before it (and `onceflow.resources`; import-linter checks it, its
contracts in pyproject.toml, `tests/test_import_contract.py`):

    declare   the public declaration (`Pipeline`, sources, sinks), schemas, durations
    dedup     record IDs already committed: the ID filters (fast path) and the raw table's log
    delta     idempotent Delta commits (SetTransaction), the commit log, schema evolution, maintenance
    sources   each source's reader, batch plans and checkpoints, landing, watermarks
    ingest    one micro-batch: plan, land, validate, dedup and commit into raw
    windows   a user's transform over one window's pinned input, panes, the window MERGE
    publish   commit sequences: a closed pane's side effects (files, BigQuery), exactly once
    verify    reconciliation from independent facts

The job shells (`ingest_job`, `finalize_job`, `maintenance_job`, `run_retention`, `run_worker`) are Dagster's
edge: they take resources and config and call a stage's plain functions.
"""
