"""The window MERGE: one run's panes replace their windows' rows in `windows/<asset>`, never a newer pane's.

A stale pane (a run that read an older close and commits after a newer pane) must change nothing in a window that
holds a newer pane: no update, no delete, and no insert either, which matters for a transform that is not
monotone (a `HAVING`, a top-N), whose older pane has keys the newer one dropped. The MERGE's source keeps only
rows whose pane is at least the newest the window holds (as the BigQuery load does); rows of older panes are
never updated or deleted by it. The source reads the window table a moment before the MERGE's transaction
does, so a newer pane committing in between could still see an older pane's keys inserted after it: the windows
are checked after the MERGE and any such rows are deleted, so a window holds one pane again. That check is needed
only when another commit came between: when the MERGE's own commit is the one right after the version the table had
just before it, both reads saw that version, and the check is skipped.
"""

from __future__ import annotations

import logging
import uuid

from pyspark.sql import SparkSession

from onceflow.jobs.delta.commit_log import committed_next
from onceflow.jobs.delta.transactions import is_concurrent_commit, latest_version, tagged_commit
from onceflow.jobs.windows.panes import PaneClose, Window

MERGE_TRIES = 3
MERGE_KEY = "onceflow_window_merge"

log = logging.getLogger("onceflow")


class OutputError(RuntimeError):
    """A transform returned something the window table cannot hold (two rows for one key)."""


def merge_panes_once(
    spark: SparkSession, windows_path: str, view: str, keys: list[str], asset: str, panes: dict[Window, PaneClose | None]
) -> int:
    """MERGE the rows of temp view `view` (their panes as `panes` says) into the window table; returns how many
    commit races were lost."""
    starts = ", ".join(f"timestamp_millis({w.start_ms})" for w in panes)
    on = " AND ".join(["t.window_start = s.window_start", *(f"t.`{k}` <=> s.`{k}`" for k in keys)])
    stale = " OR ".join(
        f"(t.window_start = timestamp_millis({w.start_ms}) AND t.pane <= {0 if c is None else c.pane})"
        for w, c in panes.items()
    )
    source = (
        f"(SELECT s.* FROM {view} s LEFT JOIN (SELECT window_start, max(pane) AS newest FROM delta.`{windows_path}` "
        f"WHERE window_start IN ({starts}) GROUP BY window_start) n ON s.window_start = n.window_start "
        "WHERE n.newest IS NULL OR s.pane >= n.newest)"
    )
    merge = (
        f"MERGE INTO delta.`{windows_path}` t USING {source} s ON t.window_start IN ({starts}) AND {on} "
        "WHEN MATCHED AND s.pane >= t.pane THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT * "
        f"WHEN NOT MATCHED BY SOURCE AND ({stale}) THEN DELETE"
    )
    lost, alone = _merge_retrying(spark, windows_path, merge, asset, list(panes))
    if not alone:
        _drop_older_panes(spark, windows_path, starts)
    return lost


def _drop_older_panes(spark: SparkSession, windows_path: str, starts: str) -> None:
    """Delete the rows of a window's older panes where a window holds more than one (see the module docstring)."""
    mixed = spark.sql(
        f"SELECT unix_millis(window_start) AS s, max(pane) AS newest FROM delta.`{windows_path}` "
        f"WHERE window_start IN ({starts}) GROUP BY window_start HAVING min(pane) < max(pane)"
    ).collect()
    if mixed:
        older = " OR ".join(f"(window_start = timestamp_millis({r['s']}) AND pane < {r['newest']})" for r in mixed)
        log.warning(f"{windows_path}: a stale pane was merged as a newer one committed; deleting its rows")
        spark.sql(f"DELETE FROM delta.`{windows_path}` WHERE {older}")


def _merge_retrying(
    spark: SparkSession, windows_path: str, merge: str, asset: str, windows: list[Window]
) -> tuple[int, bool]:
    """Run the window MERGE; when a concurrent materialization of the same windows commits first, run it again
    (it is idempotent: a pane replaces only an older or equal one). Returns how many races were lost, and whether
    the MERGE committed right after the version the table had when it began (see the module docstring)."""
    for lost in range(MERGE_TRIES):
        before, tag = latest_version(windows_path), {MERGE_KEY: uuid.uuid4().hex}
        try:
            with tagged_commit(spark, tag):
                spark.sql(merge)
            return lost, committed_next(windows_path, before, (MERGE_KEY,), tag)
        except Exception as error:
            if not is_concurrent_commit(error):
                raise
            log.warning(f"{asset} windows {windows[0].key}..{windows[-1].key}: another run committed these windows "
                        f"first; merging again ({lost + 1} of {MERGE_TRIES})")
    raise OutputError(
        f"{asset} windows {windows[0].key}..{windows[-1].key}: {MERGE_TRIES} concurrent materializations kept "
        "committing first; nothing of this run was merged (Dagster retries the run)"
    )
