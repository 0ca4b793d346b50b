"""The benchmark's chart, `bench/results/latest.png`: see `chart`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import extras, fmt

COLORS = {
    "exactly_once": "tab:blue", "at_least_once": "tab:orange", "exactly_once_dagster": "tab:cyan",
    "streaming_dedup": "tab:green",
    "streaming_merge": "tab:olive", "floor": "tab:gray",
}


def chart(result: dict[str, Any], path: Path) -> None:
    """Per data set, median records/s per contender as bars (log scale), each round's value as a dot, exactly_once ÷
    it under each bar; beside them the table growth panel when that ran; the latency figures as a footnote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    growth, latency, datasets = result.get("table_growth"), result.get("latency"), result["datasets"]
    widths = [1.6] * (len(datasets) or not growth) + [1] * bool(growth)
    fig, panels = plt.subplots(1, len(widths), figsize=(6 * sum(widths) + 0.4, 5), squeeze=False,
                               gridspec_kw={"width_ratios": widths})
    for axes, (name, ran) in zip(panels[0], datasets.items(), strict=False):
        contenders_chart(axes, name, ran, result)
    if growth:
        growth_chart(panels[0][-1], growth)
    loads = [x for ran in datasets.values() for r in ran["runs"]
             for x in (r["load_avg_1m_before"], r["load_avg_1m_after"])]
    if loads:
        fig.text(0.01, 0.01, f"1-minute load average during the timed runs: {min(loads):.1f}-{max(loads):.1f}",
                 fontsize=8)
    if latency:
        fig.text(0.99, 0.01, extras({"latency": latency})[0], fontsize=8, ha="right")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def contenders_chart(axes: Any, name: str, ran: dict[str, Any], result: dict[str, Any]) -> None:
    """The contenders' bars of one data set (see `chart`)."""
    summary, config, machine, files = ran["contenders"], result["config"], result["machine"], ran["files"]
    onceflow = summary.get("exactly_once", {}).get("median_records_per_s")
    labels = []
    for x, (contender, row) in enumerate(summary.items()):
        median = row["median_records_per_s"]
        axes.bar(x, median, color=COLORS.get(contender, "tab:purple"), alpha=0.8, width=0.6)
        rounds = row["records_per_s_by_round"]
        axes.scatter([x] * len(rounds), rounds, color="black", s=14, zorder=3, label="one round" if x == 0 else None)
        axes.text(x, max([median, *rounds]) * 1.08, f"{median:,.0f}/s", ha="center", va="bottom", fontweight="bold")
        ratio = None if onceflow is None else onceflow / median
        dups = row["duplicates_after_replay"]
        labels.append(
            f"{contender}\n{row['rows']:,} rows"
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
        f"{name}: {files['events']:,} valid records in {files['lines']:,} lines, {files['count']} files, "
        f"{files['per_batch']} per batch;\n{config['rounds']} rounds; {machine['cpus']} cores",
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
    axes.set_title(f"table growth: x{fmt(growth['ratio_with_fast_path'])} with the fast path, "
                   f"x{fmt(growth['ratio_without'])} without\n({config['records_per_batch']:,} records per batch)",
                   fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
