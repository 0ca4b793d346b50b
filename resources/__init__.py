"""The outside world as Dagster resources: Spark, the lake, sources, sinks and the durable stores.

Nothing here knows about pipelines; `jobs`, `assets` and `orchestration` build on these.
"""
