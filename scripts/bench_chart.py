#!/usr/bin/env python3
"""Charts of a bench report (target/bench/report.json) for docs/BENCHMARKS.md.

    python3 scripts/bench_chart.py target/bench/report.json docs/benchmarks

Writes p3-latency.png (the distribution of commit -> handler committed, per offered load, with
wake-ups, polling only, the hand-written pipeline, and the SDK relay and a hand-written relay
each with a hand-written consumer) and p2-throughput.png (events per second per relay count
against the raw claim+mark loop, raw publishing and a hand-written relay). A chart whose figures
are missing from the report is skipped with a message.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def median(report, key):
    measure = report["measures"].get(key)
    return None if measure is None else measure["median"]


def p3_chart(report, out):
    rates = sorted(
        {int(k.split(".")[2][1:]) for k in report["measures"] if k.startswith("p3.wake.r")}
    )
    if not rates:
        print("no P3 figures in the report: p3-latency.png not drawn")
        return
    quantiles = sorted(
        {
            float(k.rsplit(".q", 1)[1])
            for k in report["measures"]
            if k.startswith("p3.wake.") and ".q" in k
        }
    )
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
    styles = {
        "raw": ("hand-written pipeline", "tab:gray", "--"),
        "wake": ("SDK, wake-ups", "tab:blue", "-"),
        "poll": ("SDK, polling only", "tab:orange", ":"),
        "relay": ("SDK relay, hand-written consumer", "tab:purple", "-."),
        "rawrelay": ("hand-written relay (polls every 1 ms), hand-written consumer", "tab:brown", "--"),
    }
    for ax, rate in zip(axes[0], rates):
        for mode, (label, color, style) in styles.items():
            points = [
                (median(report, f"p3.{mode}.r{rate}.q{q:g}"), q * 100) for q in quantiles
            ]
            points = [(x, y) for x, y in points if x is not None]
            if not points:
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, style, color=color, marker="o", markersize=3, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("commit → handler committed (ms, log scale)")
        ax.set_ylabel("percentile")
        ax.set_title(f"P3 latency at {rate} events/s offered")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "p3-latency.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def p2_chart(report, out):
    relays = sorted(
        int(k.rsplit(".r", 1)[1]) for k in report["measures"] if k.startswith("p2.relay.r")
    )
    if not relays:
        print("no P2 figures in the report: p2-throughput.png not drawn")
        return
    values = [median(report, f"p2.relay.r{n}") for n in relays]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bars = ax.bar([str(n) for n in relays], values, color="tab:blue", label="SDK relays → JetStream")
    for bar, value in zip(bars, values):
        ax.annotate(f"{value:,.0f}", (bar.get_x() + bar.get_width() / 2, value),
                    ha="center", va="bottom", fontsize=9)
    for key, label, color, style in [
        ("p2.raw_claim_mark.w1", "raw claim+mark, 1 worker (no publish)", "tab:gray", "--"),
        ("p2.raw_claim_mark.w4", "raw claim+mark, 4 workers (no publish)", "tab:gray", ":"),
        ("p2.raw_publish", "raw pipelined publish (no database)", "tab:green", "-."),
        ("p2.raw_relay", "hand-written relay: claim, publish, mark", "tab:purple", "-"),
        ("p6.sqlxmq.drain", "sqlxmq drain", "tab:red", "-"),
    ]:
        value = median(report, key)
        if value is not None:
            ax.axhline(value, color=color, linestyle=style, label=f"{label}: {value:,.0f}/s")
    ax.set_xlabel("relays")
    ax.set_ylabel("events per second, confirmed by JetStream")
    ax.set_title("P2 relay throughput, PostgreSQL → JetStream")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = os.path.join(out, "p2-throughput.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def fmt(value):
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(report, out):
    """The report's rows as a Markdown table (results.md), to paste into docs/BENCHMARKS.md."""
    m = report["machine"]
    lines = [
        f"Medians of {report['runs']} run(s), {report['seconds']:.0f} s in all, on {m['cpus']} CPUs, "
        f"{m['memory_gib']:.0f} GiB, {m['postgres']}, NATS {m['nats']}, Linux {m['kernel']}, "
        f"{m['build']} build.",
        "",
        "| | figure | value | baseline | baseline value | ratio | target | met |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    for row in report["rows"]:
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(
            f"| {row['scenario']} | {row['figure']} | {fmt(row['value'])} {row['unit']} | "
            f"{row['baseline'] or '-'} | {fmt(row['baseline_value'])} | {ratio} | "
            f"{row['target'] or '-'} | {met} |"
        )
    path = os.path.join(out, "results.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench_chart.py REPORT.json OUT_DIR")
    with open(sys.argv[1]) as f:
        report = json.load(f)
    os.makedirs(sys.argv[2], exist_ok=True)
    p3_chart(report, sys.argv[2])
    p2_chart(report, sys.argv[2])
    table(report, sys.argv[2])


if __name__ == "__main__":
    main()
