"""The combined benchmark report: `bench/results/latest.json`, its chart `latest.png`, and the printed table.

Every figure is a median over the timed rounds of one contender; every ratio is between two medians of the same
run (same files, same Spark session and settings). A ratio whose contender did not run (`--only`) is null.
`duplicates_after_replay` is the worst round's.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import peer
from bench.ingest_throughput import Config

SPARK_SETTINGS = (
    "spark.master", "spark.driver.memory", "spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled",
    "spark.databricks.delta.snapshotPartitions", "spark.sql.session.timeZone",
)
TIMED = {
    "exactly_once": "drain only: run_micro_batch until None (plan, read, validate, dedup, MERGE, checkpoint)",
    "at_least_once": "drain only: run_micro_batch until None (plan, read, validate, append, checkpoint)",
    "streaming_dedup": "start() to termination: availableNow, dropDuplicatesWithinWatermark, foreachBatch append",
    "streaming_merge": "start() to termination: availableNow, foreachBatch dropDuplicates + insert-only MERGE",
    "floor": "spark.read.json -> write delta append (one action)",
}
COLORS = {
    "exactly_once": "tab:blue", "at_least_once": "tab:orange", "streaming_dedup": "tab:green",
    "streaming_merge": "tab:olive", "floor": "tab:gray",
}


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per contender, in the order they ran: median, spread, and what its tables held."""
    summary: dict[str, dict[str, Any]] = {}
    for contender in dict.fromkeys(r["contender"] for r in runs):
        mine = [r for r in runs if r["contender"] == contender]
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
            "timed": TIMED[contender],
        }
    return summary


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def round_ratios(summary: dict[str, dict[str, Any]], contender: str, other: str) -> list[float] | None:
    """`contender`'s records/s over `other`'s, round by round: each pair ran minutes apart at most, so these
    vary less with the machine than the ratio of the medians."""
    if contender not in summary or other not in summary:
        return None
    return [a / b for a, b in zip(summary[contender]["records_per_s_by_round"],
                                  summary[other]["records_per_s_by_round"], strict=True)]


def build(
    config: Config, runs: list[dict[str, Any]], table_growth: dict[str, Any] | None, latency: dict[str, Any] | None
) -> dict[str, Any]:
    """The JSON-ready report (without `machine`, `spark` and timestamps, which `bench.run` adds)."""
    summary = summarize(runs)

    def rps(contender: str) -> float | None:
        return summary[contender]["median_records_per_s"] if contender in summary else None

    def dups(contender: str) -> int | None:
        return summary[contender]["duplicates_after_replay"] if contender in summary else None

    onceflow = rps("exactly_once")
    by_round = {other: round_ratios(summary, "exactly_once", other)
                for other in ("at_least_once", "streaming_dedup")}
    failures = sorted({f for r in runs if r["contender"] in peer.CONTENDERS for f in r["replay"].get("failed_runs", [])})
    return {
        "benchmark": "onceflow ingest: modes, Structured Streaming peer, floor",
        "config": {
            **asdict(config),
            "records": config.records,
            "contenders": list(summary),
            "peer_watermark": peer.WATERMARK,
            "order": f"a warm-up round (discarded), then {config.rounds} rounds of " + " ".join(summary)
            + ", reversed in even rounds",
        },
        "ingest_modes": {
            "exactly_once_rps": onceflow,
            "at_least_once_rps": rps("at_least_once"),
            "ratio": _ratio(onceflow, rps("at_least_once")),
            "ratio_by_round": by_round["at_least_once"],
            "target_ratio": 0.8,
        },
        "peer": {
            "onceflow_rps": onceflow,
            "peer_rps": rps("streaming_dedup"),
            "throughput_ratio": _ratio(onceflow, rps("streaming_dedup")),
            "throughput_ratio_by_round": by_round["streaming_dedup"],
            "merge_peer_rps": rps("streaming_merge"),
            "merge_throughput_ratio": _ratio(onceflow, rps("streaming_merge")),
            "target_ratio": 1.0,
            "onceflow_duplicates_after_replay": dups("exactly_once"),
            "peer_duplicates_after_replay": dups("streaming_dedup"),
            "merge_peer_duplicates_after_replay": dups("streaming_merge"),
            # How restarts of the streams after the lost commit failed, if any did (see bench.peer._Stream._replay).
            "replay_failed_runs": failures,
        },
        "floor": {
            "onceflow_rps": onceflow,
            "floor_rps": rps("floor"),
            "fraction": _ratio(onceflow, rps("floor")),
        },
        "table_growth": table_growth,
        "latency": latency,
        "contenders": summary,
        "runs": runs,
    }


def table(result: dict[str, Any]) -> str:
    """The final printed table: median records/s per contender, and exactly_once's median divided by it."""
    summary = result["contenders"]
    onceflow = summary.get("exactly_once", {}).get("median_records_per_s")
    header = f"{'contender':<16} {'median records/s':>17} {'exactly_once ÷ it':>18} {'dups after replay':>18}"
    lines = [header] if summary else []
    for name, row in summary.items():
        ratio = _ratio(onceflow, row["median_records_per_s"])
        dups = row["duplicates_after_replay"]
        lines.append(
            f"{name:<16} {row['median_records_per_s']:>17,.0f} {'-' if ratio is None else f'{ratio:.2f}':>18} "
            f"{'-' if dups is None else dups:>18}"
        )
    return "\n".join([*lines, *extras(result)])


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def extras(result: dict[str, Any]) -> list[str]:
    """Printed lines for the round-by-round ratios, `table_growth` and `latency`, when they ran."""
    lines = []
    for label, by_round in (("at_least_once", result.get("ingest_modes", {}).get("ratio_by_round")),
                            ("streaming_dedup", result.get("peer", {}).get("throughput_ratio_by_round"))):
        if by_round:
            lines.append(f"exactly_once ÷ {label}, round by round: " + " ".join(f"{r:.2f}" for r in by_round))
    growth, latency = result.get("table_growth"), result.get("latency")
    if growth:
        for rows, size in growth["sizes"].items():
            lines.append(f"table_growth {int(rows):>12,} rows: median batch {size['with_batch_s']:.2f} s with the "
                         f"fast path, {size['without_batch_s']:.2f} s without; "
                         f"filter rebuild {size['filter_rebuild_s']:.2f} s")
        small, large = growth["ratio_sizes"]
        lines.append(f"table_growth {large:,} / {small:,} rows: with the fast path "
                     f"x{_num(growth['ratio_with_fast_path'])}, without x{_num(growth['ratio_without'])}")
    if latency:
        lines.append(f"latency: publish -> raw committed p50 {_num(latency['publish_to_raw_p50_s'], ' s')}, "
                     f"p90 {_num(latency['publish_to_raw_p90_s'], ' s')}; drain "
                     f"{latency['landed_records_per_s']:,.0f} records/s; tick -> commit: "
                     f"{_num(latency['tick_to_commit_median_s'], ' s')} ({latency.get('tick_to_commit_note', '')})")
    return lines


def write(result: dict[str, Any], directory: Path) -> tuple[Path, Path]:
    json_path, png_path = directory / "latest.json", directory / "latest.png"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    chart(result, png_path)
    return json_path, png_path


def chart(result: dict[str, Any], path: Path) -> None:
    """Median records/s per contender as bars (log scale), each round's value as a dot, exactly_once ÷ it under
    each bar; beside it the table growth panel when that ran; the latency figures as a footnote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    growth, latency = result.get("table_growth"), result.get("latency")
    bars = bool(result["contenders"]) or not growth
    widths = [1.6] * bars + [1] * bool(growth)
    fig, panels = plt.subplots(1, len(widths), figsize=(6 * sum(widths) + 0.4, 5), squeeze=False,
                               gridspec_kw={"width_ratios": widths})
    if bars:
        contenders_chart(panels[0][0], result)
    if growth:
        growth_chart(panels[0][-1], growth)
    loads = [x for r in result["runs"] for x in (r["load_avg_1m_before"], r["load_avg_1m_after"])]
    if loads:
        fig.text(0.01, 0.01, f"1-minute load average during the timed runs: {min(loads):.1f}-{max(loads):.1f}",
                 fontsize=8)
    if latency:
        fig.text(0.99, 0.01, extras({"latency": latency})[0], fontsize=8, ha="right")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def contenders_chart(axes: Any, result: dict[str, Any]) -> None:
    """The contenders' bars (see `chart`)."""
    summary, config, machine = result["contenders"], result["config"], result["machine"]
    onceflow = summary.get("exactly_once", {}).get("median_records_per_s")
    labels = []
    for x, (name, row) in enumerate(summary.items()):
        median = row["median_records_per_s"]
        axes.bar(x, median, color=COLORS.get(name, "tab:purple"), alpha=0.8, width=0.6)
        rounds = row["records_per_s_by_round"]
        axes.scatter([x] * len(rounds), rounds, color="black", s=14, zorder=3, label="one round" if x == 0 else None)
        axes.text(x, max([median, *rounds]) * 1.08, f"{median:,.0f}/s", ha="center", va="bottom", fontweight="bold")
        ratio = _ratio(onceflow, median)
        dups = row["duplicates_after_replay"]
        labels.append(
            f"{name}\n{row['rows']:,} rows"
            + ("" if ratio is None else f"\nexactly_once ÷ it = {ratio:.2f}")
            + ("" if dups is None else f"\n{dups} dups after replay")
        )
    axes.set_xticks(range(len(labels)), labels, fontsize=8)
    axes.set_yscale("log")  # the floor is tens of times faster than anything that deduplicates
    axes.set_ylabel("records / s (median of rounds; log scale)")
    axes.margins(y=0.2)
    if summary:
        axes.legend(loc="upper left", fontsize=8)
    axes.set_title(
        f"{config['events']:,} events + {config['retry_fraction']:.0%} publisher retries = {config['records']:,} "
        f"records in {config['files']} files, {config['files_per_batch']} files per batch; "
        f"{config['rounds']} rounds; {machine['cpus']} cores",
        fontsize=10,
    )


def growth_chart(axes: Any, growth: dict[str, Any]) -> None:
    """Median seconds per batch against raw table rows, with and without the fast path; filter rebuilds noted."""
    sizes = sorted(growth["sizes"].values(), key=lambda size: size["rows"])
    rows = [size["rows"] for size in sizes]
    lines = (("with_batch_s", "with fast path", "tab:blue"), ("without_batch_s", "without", "tab:red"))
    for key, label, color in lines:
        axes.plot(rows, [size[key] for size in sizes], "o-", color=color, label=label)
    for size in sizes:
        axes.annotate(f"rebuild {size['filter_rebuild_s']:.1f} s", (size["rows"], size["with_batch_s"]),
                      textcoords="offset points", xytext=(0, -14), ha="center", fontsize=7)
    axes.set_xscale("log")
    axes.set_ylim(bottom=0)
    axes.set_xlabel("raw table rows inside the dedup horizon")
    axes.set_ylabel("seconds per batch (median)")
    config = growth["config"]
    axes.set_title(f"table growth: x{_num(growth['ratio_with_fast_path'])} with the fast path, "
                   f"x{_num(growth['ratio_without'])} without\n({config['records_per_batch']:,} records per batch)",
                   fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
