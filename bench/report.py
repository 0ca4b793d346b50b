"""The combined benchmark report: `bench/results/latest.json`, its chart `latest.png` (`bench.chart`), and the
printed tables, one per data set.

Every figure is a median over the timed rounds of one contender; every ratio is between two medians of the same
run (same files, same Spark session and settings), or between two runs of the same round. A ratio whose
contender did not run (`--only`) is null. `duplicates_after_replay` and `peak_rss_bytes` are the worst round's.
Exactly-once ÷ at-least-once by round is of each mode's three runs in the round, placed A B ... B A A B
(`bench.run`); the figures of single runs count only the first of them.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import peer
from bench.ingest_throughput import THROUGH_DAGSTER, Config
from bench.loaded_growth import lines as loaded_growth_lines
from bench.stages import stage_lines, stage_medians, stage_text

SPARK_SETTINGS = (
    "spark.master", "spark.driver.memory", "spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled",
    "spark.databricks.delta.snapshotPartitions", "spark.sql.session.timeZone",
)
TIMED = {
    "exactly_once": "drain only: run_micro_batch until None (plan, read, validate, dedup, MERGE, checkpoint)",
    "at_least_once": "drain only: run_micro_batch until None (plan, read, validate, append, checkpoint)",
    "exactly_once_dagster": "the Dagster job ingest_<name>'s worker runs, in process on a SQLite instance: the first "
    "run's start to the last batch's commit (its materialization's committed_at_ms)",
    "streaming_dedup": "start() to termination: availableNow, dropDuplicatesWithinWatermark, foreachBatch append",
    "streaming_merge": "start() to termination: availableNow, foreachBatch dropDuplicates + insert-only MERGE",
    "floor": "spark.read.json -> write delta append (one action)",
}


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per contender, in the order they ran: median, spread, and what its tables held."""
    summary: dict[str, dict[str, Any]] = {}
    for contender in dict.fromkeys(r["contender"] for r in runs):
        mine = [r for r in runs if r["contender"] == contender and not r.get("second_pass")]
        rates = [r["records_per_s"] for r in mine]
        replays = [r["duplicates_after_replay"] for r in mine if r["duplicates_after_replay"] is not None]
        summary[contender] = {
            "median_records_per_s": statistics.median(rates),
            "min_records_per_s": min(rates),
            "max_records_per_s": max(rates),
            "records_per_s_by_round": rates,
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "records": mine[0]["records"],
            "rows": mine[0]["rows"],
            "distinct_ids": mine[0]["distinct_ids"],
            "duplicates_after_replay": max(replays) if replays else None,
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in mine),
            "same_rows": _same_rows(mine),
            "timed": TIMED[contender],
        }
    return summary


def _same_rows(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the comparison with exactly-once's valid rows found (the same in every round, or it failed the run)."""
    compared = [r["same_rows"] for r in runs if r["same_rows"] is not None]
    if not compared:
        return None
    last = compared[-1]
    return {key: last[key] for key in ("valid_rows", "valid_ids", "kept_dead_letters", "other_rows")}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def round_ratios(summary: dict[str, dict[str, Any]], contender: str, other: str) -> list[float] | None:
    """`contender`'s records/s over `other`'s, round by round: each pair ran minutes apart at most, so these
    vary less with the machine than the ratio of the medians."""
    if contender not in summary or other not in summary:
        return None
    return [a / b for a, b in zip(summary[contender]["records_per_s_by_round"],
                                  summary[other]["records_per_s_by_round"], strict=True)]


def paired_mode_ratios(runs: list[dict[str, Any]]) -> list[float] | None:
    """Exactly-once ÷ at-least-once per round, each mode's records over its seconds summed over its runs of the
    round; None unless both modes ran the same number of times, more than once, in every round."""
    by_round: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {}).setdefault(run["contender"], []).append(run)

    def rate(mine: list[dict[str, Any]]) -> float:
        return sum(r["records"] for r in mine) / sum(r["seconds"] for r in mine)

    pairs = [(modes.get("exactly_once", []), modes.get("at_least_once", [])) for _, modes in sorted(by_round.items())]
    if not pairs or any(len(eo) != len(alo) or len(eo) < 2 for eo, alo in pairs):
        return None
    return [rate(eo) / rate(alo) for eo, alo in pairs]


def build(
    config: Config, datasets: list[dict[str, Any]], table_growth: dict[str, Any] | None,
    latency: dict[str, Any] | None, landing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-ready report (without `machine`, `spark` and timestamps, which `bench.run` adds)."""
    return {
        "benchmark": "onceflow ingest: modes, Structured Streaming peer, floor; per data set",
        "config": {**asdict(config), "peer_watermark": peer.WATERMARK},
        "datasets": {d["dataset"]: dataset(config, d) for d in datasets},
        "table_growth": table_growth,
        "latency": latency,
        "landing": landing,
    }


def dataset(config: Config, ran: dict[str, Any]) -> dict[str, Any]:
    """One data set's part of the report: what its files held, each contender's summary and the ratios."""
    runs = ran["runs"]
    summary = summarize(runs)

    def rps(contender: str) -> float | None:
        return summary[contender]["median_records_per_s"] if contender in summary else None

    def dups(contender: str) -> int | None:
        return summary[contender]["duplicates_after_replay"] if contender in summary else None

    onceflow = rps("exactly_once")
    paired = paired_mode_ratios(runs)
    by_round = {other: round_ratios(summary, "exactly_once", other) for other in summary if other != "exactly_once"}
    failures = sorted({f for r in runs if r["contender"] in peer.CONTENDERS for f in r["replay"].get("failed_runs", [])})
    return {
        "description": ran["description"],
        "files": {**ran["files"], "count": config.files, "per_batch": config.files_per_batch},
        "order": f"{config.warm_ups} warm-up rounds (discarded), then {config.rounds} rounds of " + " ".join(summary)
        + ", reversed in even rounds"
        + (", then exactly_once and at_least_once again in the reverse of that round's order, then in its order"
           if paired else ""),
        "exactly_once_ratio_by_round": by_round,
        "ingest_modes": {
            "exactly_once_rps": onceflow,
            "at_least_once_rps": rps("at_least_once"),
            "ratio": _ratio(onceflow, rps("at_least_once")),
            "ratio_by_round": paired,
            "single_run_ratio_by_round": by_round.get("at_least_once"),
            "target_ratio": 0.9,
        },
        "peer": {
            "onceflow_rps": onceflow,
            "peer_rps": rps("streaming_dedup"),
            "throughput_ratio": _ratio(onceflow, rps("streaming_dedup")),
            "throughput_ratio_by_round": by_round.get("streaming_dedup"),
            # Exactly-once as users run it, through Dagster (`bench.ingest_throughput._drain_by_job`).
            "dagster_rps": rps(THROUGH_DAGSTER),
            "dagster_throughput_ratio": _ratio(rps(THROUGH_DAGSTER), rps("streaming_dedup")),
            "dagster_throughput_ratio_by_round": round_ratios(summary, THROUGH_DAGSTER, "streaming_dedup"),
            "merge_peer_rps": rps("streaming_merge"),
            "merge_throughput_ratio": _ratio(onceflow, rps("streaming_merge")),
            "target_ratio": 1.0,
            "onceflow_duplicates_after_replay": dups("exactly_once"),
            "peer_duplicates_after_replay": dups("streaming_dedup"),
            "merge_peer_duplicates_after_replay": dups("streaming_merge"),
            # How restarts of the streams after the lost commit failed, if any did (see bench.peer._Stream._replay).
            "replay_failed_runs": failures,
        },
        "floor": {"onceflow_rps": onceflow, "floor_rps": rps("floor"), "fraction": _ratio(onceflow, rps("floor"))},
        "batch_stages": stage_medians(runs),
        "contenders": summary,
        "runs": runs,
    }


def table(result: dict[str, Any]) -> str:
    """The final printed tables: per data set, median records/s per contender, exactly_once's median divided by
    it, its round-by-round ratios, and what each table held beside the valid rows; then the other benchmarks."""
    lines = [_provenance(result)]
    for name, ran in result["datasets"].items():
        summary = ran["contenders"]
        files = ran["files"]
        lines += ["", f"{name}: {ran['description']}; {files['lines']:,} lines, {files['events']:,} distinct valid "
                  "records", f"{'contender':<20} {'median records/s':>17} {'exactly_once ÷ it':>18} "
                  f"{'dups after replay':>18} {'peak RSS MiB':>13}"]
        onceflow = summary.get("exactly_once", {}).get("median_records_per_s")
        for contender, row in summary.items():
            ratio = _ratio(onceflow, row["median_records_per_s"])
            dups = row["duplicates_after_replay"]
            lines.append(
                f"{contender:<20} {row['median_records_per_s']:>17,.0f} {'-' if ratio is None else f'{ratio:.2f}':>18} "
                f"{'-' if dups is None else dups:>18} {row['peak_rss_bytes'] / 2**20:>13,.0f}"
            )
        for other, by_round in ran["exactly_once_ratio_by_round"].items():
            if by_round:
                lines.append(f"exactly_once ÷ {other}, round by round: " + " ".join(f"{r:.2f}" for r in by_round))
        through_dagster = ran["peer"].get("dagster_throughput_ratio_by_round")
        if through_dagster:
            lines.append(f"{THROUGH_DAGSTER} ÷ streaming_dedup, round by round: "
                         + " ".join(f"{r:.2f}" for r in through_dagster))
        paired = ran["ingest_modes"]["ratio_by_round"]
        if paired:
            lines.append("exactly_once ÷ at_least_once, round by round, three runs each (A B ... B A A B): "
                         + " ".join(f"{r:.2f}" for r in paired))
        lines += stage_lines(ran.get("batch_stages", {}))
        for contender, row in summary.items():
            same = row["same_rows"]
            if same and (same["kept_dead_letters"] or same["other_rows"]):
                kept = ", ".join(f"{n} {reason}" for reason, n in same["kept_dead_letters"].items())
                lines.append(f"{contender} kept rows onceflow dead-lettered: {kept or 'none'}; "
                             f"{same['other_rows']} rows without an ID onceflow knows")
    return "\n".join([*lines, *extras(result)]).strip("\n")


def _provenance(result: dict[str, Any]) -> str:
    """When, on which commit and on how busy a machine the figures were taken."""
    commit, host = result.get("commit") or {}, result.get("machine") or {}
    load = [f"{host[k][0]:.2f}" for k in ("load_avg_before", "load_avg_after") if k in host]
    modified = commit.get("modified_files")
    return (f"started {result.get('started_at', '?')} on commit {(commit.get('sha') or '?')[:12]}"
            + (f" (with {len(modified)} files modified)" if modified else "")
            + (f"; load average (1 min) {' -> '.join(load)}" if load else "")
            + (f"; {result['elapsed_s']:,.0f} s in all" if "elapsed_s" in result else "")
            + (f"; contenders' engine: {result['engine']}" if "engine" in result else ""))


def fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def extras(result: dict[str, Any]) -> list[str]:
    """Printed lines for `table_growth`, `redelivery`, `latency`, `landing`, `kafka`, `kafka_postgres`, `sink_latency` and
    `profiles`, when they ran."""
    lines = []
    growth, latency, landing = result.get("table_growth"), result.get("latency"), result.get("landing")
    if growth:
        for rows, size in growth["sizes"].items():
            lines.append(f"table_growth {int(rows):>12,} rows: median batch {size['with_batch_s']:.2f} s with the "
                         f"fast path, {size['without_batch_s']:.2f} s without; redelivery batch "
                         f"{size.get('with_redelivery_s', float('nan')):.2f} s with, "
                         f"{size.get('without_redelivery_s', float('nan')):.2f} s without; "
                         f"filter rebuild {size['filter_rebuild_s']:.2f} s")
            lines += [f"table_growth {int(rows):>12,} rows: {kind} batch with the fast path, median ms: "
                      f"{stage_text(ms)}" for kind, ms in size.get("with_stage_ms", {}).items()]
        small, large = growth["ratio_sizes"]
        lines.append(f"table_growth {large:,} / {small:,} rows: with the fast path "
                     f"x{fmt(growth['ratio_with_fast_path'])}, without x{fmt(growth['ratio_without'])}; redelivery "
                     f"batch with x{fmt(growth.get('ratio_redelivery_with_fast_path'))}, without "
                     f"x{fmt(growth.get('ratio_redelivery_without'))}{_memory(growth)}")
    if result.get("loaded_growth"):
        lines += loaded_growth_lines(result["loaded_growth"])
    again = result.get("redelivery")
    if again and again["ratio"]:
        small, large = again["ratio_sizes"]
        for layout, kinds in again["ratio"].items():
            grew = {rows: (size["rebuild_peak_rss_bytes"] - size["rebuild_rss_before_bytes"]) / 2**20
                    for rows, size in again["sizes"][layout].items()}
            lines.append(f"redelivery lookup, {layout} IDs, {large:,} / {small:,} rows: "
                         + ", ".join(f"{kind} x{ratio:.2f} ({again['sizes'][layout][str(large)][kind]['median_s']:.3f} s)"
                                     for kind, ratio in kinds.items())
                         + "; filter rebuild's memory +" + " / +".join(f"{grew[str(n)]:,.0f}" for n in (small, large))
                         + " MiB" + _memory(again))
    if latency:
        lines.append(f"latency: publish -> raw committed p50 {fmt(latency['publish_to_raw_p50_s'], ' s')}, "
                     f"p90 {fmt(latency['publish_to_raw_p90_s'], ' s')}; drain "
                     f"{latency['landed_records_per_s']:,.0f} records/s; tick -> commit: "
                     f"{fmt(latency['tick_to_commit_median_s'], ' s')} ({latency.get('tick_to_commit_note', '')})"
                     f"{_memory(latency)}")
    if landing:
        lines.append(f"landing publish -> landed: {landing['records_per_s']:,.0f} records/s with "
                     f"{landing['config']['pull_streams']} pulls in flight, {landing['single_pull_records_per_s']:,.0f} "
                     f"with one (x{landing['parallel_over_single_pull']:.2f}); x{landing['parallel_over_baseline']:.2f} "
                     f"the {landing['baseline_2026_11_24_records_per_s']:,.0f} records/s of 2026-11-24; the emulator "
                     f"itself serves {landing['emulator_ceiling']['records_per_s']:,.0f} (x"
                     f"{landing['ceiling_over_baseline']:.2f}){_memory(landing)}")
    streamed = result.get("kafka")
    if streamed:
        rps = streamed["records_per_s"]
        lines.append("kafka: " + ", ".join(f"{name} {value:,.0f}" for name, value in rps.items()) + " records/s; "
                     f"exactly_once ÷ streaming_dedup x{streamed['exactly_once_over_streaming_dedup']:.2f} (round by "
                     "round " + " ".join(f"{r:.2f}" for r in streamed["exactly_once_over_streaming_dedup_by_round"])
                     + f"), ÷ floor x{streamed['exactly_once_over_floor']:.2f}{_memory(streamed)}")
    published = result.get("kafka_postgres")
    if published:
        rps, latency = published["records_per_s"], published["raw_commit_to_postgres_s"]
        dups = published["duplicates_after_a_replayed_batch"]
        lines.append("kafka -> postgres: " + ", ".join(f"{name} {value:,.0f}" for name, value in rps.items())
                     + f" records/s; exactly_once ÷ foreach_batch_jdbc x{published['exactly_once_over_foreach_batch_jdbc']:.2f}"
                     + " (round by round " + " ".join(f"{r:.2f}" for r in published["by_round"]) + "); duplicates "
                     f"after a replayed batch: exactly_once {dups['exactly_once']}, foreach_batch_jdbc "
                     f"{dups['foreach_batch_jdbc']}; raw commit -> PostgreSQL p50 {latency['p50']:.2f} s, p90 "
                     f"{latency['p90']:.2f} s over {latency['batches']} batches{_memory(published)}")
    delivered = result.get("sink_latency")
    if delivered:
        lines.append("raw commit -> sink (batches of " + f"{delivered['config']['batch']:,}): " + ", ".join(
            f"{name} p50 {s['p50']:.2f} s p90 {s['p90']:.2f} s" for name, s in delivered["raw_commit_to_sink_s"].items())
            + _memory(delivered))
    deployed = result.get("profiles")
    if deployed:
        local, cluster = (deployed["profiles"][name]["records_per_s"] for name in ("local", "cluster-gcs"))
        lines.append(f"profiles (exactly-once, classic): local {local:,.0f} records/s, cluster-gcs {cluster:,.0f} "
                     f"records/s: x{deployed['cluster_over_local']:.2f} (a cost on one 2-core machine, not a speed-up)"
                     f"{_memory(deployed)}")
    return lines


def _memory(part: dict[str, Any]) -> str:
    """The driver's peak resident memory while a benchmark ran (`bench.run.with_memory`), when recorded."""
    if "peak_rss_bytes" not in part:
        return ""
    return f"; driver peak RSS {part['peak_rss_bytes'] / 2**20:,.0f} MiB (before {part['rss_before_bytes'] / 2**20:,.0f})"


def write(result: dict[str, Any], directory: Path) -> Path:
    path = directory / "latest.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
