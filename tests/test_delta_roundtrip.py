"""The foundation works: Spark MERGEs into a Delta table and delta-rs reads back exactly those rows."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from tests.delta_reader import read_rows, table_version


def test_merge_then_read_back_with_delta_rs(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id STRING, n BIGINT) USING delta")
    spark.createDataFrame([("a", 1), ("b", 2)], "id string, n bigint").write.format("delta").mode(
        "append"
    ).save(path)
    spark.createDataFrame([("b", 20), ("c", 3)], "id string, n bigint").createOrReplaceTempView("src")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING src s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET n = s.n WHEN NOT MATCHED THEN INSERT *"
    )

    assert read_rows(path, ["id", "n"]) == [("a", 1), ("b", 20), ("c", 3)]
    assert table_version(path) == 2
