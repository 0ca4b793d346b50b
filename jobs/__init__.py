"""Dagster jobs and the Spark work they run: land + ingest micro-batches, finalize and commit."""
