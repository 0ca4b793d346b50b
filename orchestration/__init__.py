"""Dagster definitions, pipeline declarations, sensors and the `onceflow` command line."""
