#!/usr/bin/env python3
"""Plots the JSON of `tandem bench serve` (serve.json) as a PNG.

    python3 tools/bench/plot_serve.py serve.json serve.png

Four panels against concurrency (log2 axis), one line per mode: output tokens/s (the median
over the rounds, bars from the slowest to the fastest round), auto's tokens/s over the best
fixed mode's (medians, with the pass threshold; dashed: the median of the per-round paired
ratios), inter-token latency and end-to-end latency (p50 solid, p99 dashed). Also reads the
JSON of versions without rounds (one window per cell, no bars). Needs matplotlib (Debian:
python3-matplotlib, installed by scripts/setup.sh).
"""

import argparse
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", help="serve.json written by `tandem bench serve`")
    parser.add_argument("png", help="the plot to write")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print(
            "matplotlib is missing: install python3-matplotlib (scripts/setup.sh does)",
            file=sys.stderr,
        )
        return 3

    with open(args.json, encoding="utf-8") as f:
        run = json.load(f)
    levels = run["levels"]
    modes = run["modes"]

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    (tps_ax, ratio_ax), (itl_ax, e2e_ax) = axes
    for mode in modes:
        rows = sorted((l for l in levels if l["mode"] == mode), key=lambda l: l["concurrency"])
        if not rows:
            continue
        c = [l["concurrency"] for l in rows]
        style = {"marker": "o", "linewidth": 2.5 if mode == "auto" else 1.5}
        tps = [l["tokens_per_second"] for l in rows]
        if all("tokens_per_second_min" in l for l in rows):
            spread = [[t - l["tokens_per_second_min"] for t, l in zip(tps, rows)],
                      [l["tokens_per_second_max"] - t for t, l in zip(tps, rows)]]
            line = tps_ax.errorbar(c, tps, yerr=spread, capsize=3, label=mode, **style).lines[0]
        else:
            line = tps_ax.plot(c, tps, label=mode, **style)[0]
        color = line.get_color()
        for ax, key in ((itl_ax, "itl"), (e2e_ax, "e2e")):
            ax.plot(c, [l[f"{key}_p50_seconds"] * 1e3 for l in rows], color=color, label=mode,
                    **style)
            ax.plot(c, [l[f"{key}_p99_seconds"] * 1e3 for l in rows], color=color,
                    linestyle="--", marker=".", linewidth=1)

    ratios = run.get("auto_vs_best", [])
    if ratios:
        c = [r["concurrency"] for r in ratios]
        ratio_ax.plot(c, [r["ratio"] for r in ratios], marker=".", color="gray",
                      linestyle="--", label="auto / best (medians)")
        if all("paired_ratio_median" in r for r in ratios):
            ratio_ax.plot(c, [r["paired_ratio_median"] for r in ratios], marker="o",
                          color="black", label="paired per round (median; decides)")
        for r in ratios:
            ratio_ax.annotate(r["best_mode"],
                              (r["concurrency"], r.get("paired_ratio_median", r["ratio"])),
                              textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ratio_ax.axhline(run["threshold"], color="red", linestyle=":",
                         label=f"pass: {run['threshold']:.2f}")
        ratio_ax.legend(fontsize=8)
    else:
        ratio_ax.text(0.5, 0.5, "no auto runs", ha="center", va="center",
                      transform=ratio_ax.transAxes)

    titles = {
        tps_ax: (f"output tokens/s (median of {run.get('rounds', 1)} rounds"
                 + (f", + {run['pair_rounds']} per pairing of auto with a leading mode"
                    if run.get("pair_rounds", 0) > 0 else "")
                 + "; bars: min to max)"
                 if run.get("rounds", 1) + run.get("pair_rounds", 0) > 1 else "output tokens/s",
                 "tokens/s"),
        ratio_ax: ("auto / best fixed mode (tokens/s; label: best mode)", "ratio"),
        itl_ax: ("inter-token latency (p50 solid, p99 dashed)", "ms"),
        e2e_ax: ("end-to-end latency (p50 solid, p99 dashed)", "ms"),
    }
    for ax, (title, ylabel) in titles.items():
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(run["concurrency"])
        ax.set_xticklabels([str(c) for c in run["concurrency"]])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("concurrency (closed-loop clients)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    tps_ax.legend(fontsize=8)
    for ax in (itl_ax, e2e_ax):
        ax.set_yscale("log")
    fig.suptitle(
        f"tandem bench serve: {os.path.basename(run['model'].rstrip('/'))}, {run['max_tokens']} tokens per request, "
        f"{run['date']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
