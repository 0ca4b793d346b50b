"""Ingest: one micro-batch end to end (plan, land, validate, dedup, commit into raw, advance the checkpoint).
Imports `declare`, `dedup`, `delta`, `sources` and `onceflow.resources`."""
