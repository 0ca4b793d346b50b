"""What a Spark Connect server made of a client's DataFrame."""

from __future__ import annotations

from pyspark.sql import DataFrame


def parsed_plan(df: DataFrame) -> str:
    """The plan the server's planner made of the Connect DataFrame `df`, before analysis (a relation plugin's
    answer shows here as it returned it)."""
    return df._explain_string(extended=True).split("== Parsed Logical Plan ==\n", 1)[1].split("\n\n", 1)[0]
