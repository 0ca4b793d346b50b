"""Record IDs' fingerprints, what the ID filters (`onceflow.jobs.dedup.id_filters`) hold and search.

A fingerprint is two independent keyed 64-bit SipHash-2-4 values of the ID's UTF-8 bytes. Two distinct IDs share
one with probability 2^-128, so a batch of b fresh IDs checked against n committed ones takes one for a repeat with
probability at most b*n/2^128 (10^-27 for 25,000 against 10^7): far below the undetected-error rate of the checksums
the table's own files rely on. That is why a fingerprint found is a repeat.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from onceflow.resources.spark_functions import compiled_functions

_HASH_KEYS = ("onceflow-ids-001", "onceflow-ids-002")
ID_HASH_COLUMNS = ("id_hash_first", "id_hash_second")
"""A batch's fingerprint halves, where its Spark stage computed them (`id_hash_sql`)."""


@dataclass(frozen=True)
class Fingerprints:
    """Each ID's 128-bit fingerprint as two 64-bit halves: `first` (the sort and search key) and `second`."""

    first: np.ndarray
    second: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def take(self, where: np.ndarray) -> Fingerprints:
        return Fingerprints(self.first[where], self.second[where])

    @staticmethod
    def concat(parts: list[Fingerprints]) -> Fingerprints:
        return Fingerprints(np.concatenate([p.first for p in parts] or [np.zeros(0, np.uint64)]),
                            np.concatenate([p.second for p in parts] or [np.zeros(0, np.uint64)]))


def id_hashes(ids: pa.Array | pa.ChunkedArray) -> Fingerprints:
    """The fingerprint of each record ID: stable across processes (fixed keys)."""
    values = np.asarray(ids.to_numpy(zero_copy_only=False), dtype=object)
    first, second = (pd.util.hash_array(values, hash_key=key, categorize=False) for key in _HASH_KEYS)
    return Fingerprints(first, second)


def id_hash_sql(column: str = "record_id") -> tuple[str, ...]:
    """SQL outputs computing the fingerprint halves of `column` in a Spark stage, on its executors, bit for bit as
    `id_hashes` does (`onceflow_id_hash`, `IdHash.java`, where the session has it: `compiled_functions`)."""
    return tuple(f"onceflow_id_hash({column}, '{key}') AS {name}" for key, name in zip(_HASH_KEYS, ID_HASH_COLUMNS, strict=True))


_TEST_VECTOR_IDS = ("", "a", "events/files:0", "ünïcode-€-1", "0" * 64)


def hash_test_vector() -> list[int]:
    """The fingerprints of a few fixed IDs as this process computes them. Saved filters record them: filters
    hashed by another implementation (a pandas release that hashes differently) answer for other IDs and are
    rebuilt."""
    prints = id_hashes(pa.array(_TEST_VECTOR_IDS))
    return [int(h) for pair in zip(prints.first, prints.second, strict=True) for h in pair]


def hashes_in_spark(spark: SparkSession) -> bool:
    """Whether `spark`'s batches may compute their IDs' fingerprints in their Spark stage (`id_hash_sql`): it has
    onceflow's compiled functions, and they hash the test vector bit for bit as `id_hashes` does (asked once per
    session). Saved filters record the test vector as `id_hashes` computes it; a JVM that hashed otherwise would
    answer for other IDs, so a session that disagrees has its batches hashed on the driver instead."""
    if not compiled_functions(spark):
        return False
    if spark not in _AGREES:
        rows = spark.createDataFrame(list(enumerate(_TEST_VECTOR_IDS)), "i INT, record_id STRING") \
            .selectExpr("i", *id_hash_sql()).orderBy("i").collect()
        _AGREES[spark] = [int(h) % 2**64 for row in rows for h in list(row)[1:]] == hash_test_vector()
    return _AGREES[spark]


_AGREES: weakref.WeakKeyDictionary[SparkSession, bool] = weakref.WeakKeyDictionary()
