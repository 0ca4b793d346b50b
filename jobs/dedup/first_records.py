"""Which record of a batch is kept for each record ID: the first in landing order (its `ordinal`).

A batch's valid records are deduplicated on the driver from a few of their columns (`first_ids`; by their
fingerprints, `first_prints`, for the ID filters), and the rest dropped: by a mask where the batch's rows came to
the driver whole (`onceflow.jobs.ingest.batch_read.BatchRead`), by ordinal in Spark (`without_ordinals`); its dead
letters alike (`onceflow.jobs.ingest.dead_letters`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow.jobs.dedup.fingerprints import ID_HASH_COLUMNS, Fingerprints, id_hashes


def first_ids(valid: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The first record of each ID (the rows of `valid`, by its `record_id` and `ordinal`), and which rows of `valid`
    they are (a mask). A NULL ID is one ID too.

    In landing order, a record is the first of its ID when its ID's code (numbered by first appearance) exceeds
    every code before it: one pass, where grouping by ID and matching the minimum ordinals back took twice as long.
    """
    ordinals = valid["ordinal"].to_numpy()
    order = np.argsort(ordinals, kind="stable")  # a batch's rows come as runs already sorted (files, partitions)
    landed = pc.take(valid["record_id"], pa.array(order))
    codes = pc.dictionary_encode(landed.combine_chunks(), null_encoding="encode").indices.to_numpy()
    seen_before = np.maximum.accumulate(np.concatenate(([-1], codes[:-1])))
    kept = np.empty(len(order), bool)
    kept[order] = codes > seen_before
    return valid.filter(pa.array(kept)), kept


def first_prints(valid: pa.Table) -> tuple[Fingerprints, np.ndarray]:
    """The fingerprint of the first record of each ID of `valid` (rows with their `ordinal`, and the fingerprint
    halves `ID_HASH_COLUMNS` where the batch's Spark stage computed them, else their `record_id`), sorted by first
    half; and which rows of `valid` those records are (positions, in that order).

    With the halves, rows are grouped by fingerprint, which stands for the ID (`onceflow.jobs.dedup.fingerprints`):
    the one sort that orders them for the ID filters finds the repeats too, where grouping the ID strings cost as
    much again. Without them, by `first_ids`, and the first records' IDs are hashed here."""
    if ID_HASH_COLUMNS[0] not in valid.column_names:
        firsts, kept = first_ids(valid)
        prints = id_hashes(firsts["record_id"])
        order = np.argsort(prints.first)
        return prints.take(order), np.flatnonzero(kept)[order]
    first, second = (valid[name].to_numpy().view(np.uint64) for name in ID_HASH_COLUMNS)
    ordinals = valid["ordinal"].to_numpy()
    order = np.argsort(first)
    repeated = first[order][1:] == first[order][:-1]
    if repeated.any():  # the rows of each repeated first half ordered by second half, then by landing order
        runs = np.flatnonzero(np.concatenate(([False], repeated)) | np.concatenate((repeated, [False])))
        rows = order[runs]
        order[runs] = rows[np.lexsort((ordinals[rows], second[rows], first[rows]))]
    first, second = first[order], second[order]
    heads = np.ones(len(order), dtype=bool)
    heads[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
    return Fingerprints(first[heads], second[heads]), order[heads]


def without_ordinals(rows: DataFrame, ordinals: np.ndarray) -> DataFrame:
    """`rows` without those at `ordinals`, and without the ordinal column.

    The ordinals go to Spark as one binary literal, sorted, that `onceflow_not_among` (registered by
    `onceflow.resources.spark_functions`) searches for each row: no table of them to build and broadcast first.
    """
    if len(ordinals):
        members = np.unique(ordinals.astype(np.int64)).astype(">i8").tobytes()
        rows = rows.filter(F.call_function("onceflow_not_among", F.lit(bytearray(members)), F.col("ordinal")))
    return rows.drop("ordinal")
